"""Triton launches with the JIT's per-call work done once per specialisation.

    launch(kernel, grid, *args, **kwargs)     # what kernel[grid](*args, **kwargs) does, with less host time

``kernel[grid](...)`` binds every argument to the kernel's signature and rebuilds its specialisation key on each
call: ~0.1 ms of host time per launch on the H100 machine's CPU (cProfile, N = 64; NOTES.md, session 21), four such
launches in a triangle multiplication's forward + backward. Here the first call of a key goes through the JIT, which
compiles the kernel or finds it in its caches, launches it and returns the compiled kernel; later calls of the key
launch that compiled kernel directly (``CompiledKernel[grid](*args)``, as the JIT itself does).

The key holds everything Triton specialises a kernel on, so that a key never maps to a kernel compiled for other
arguments: each tensor's dtype and whether its data pointer is 16-byte aligned, every integer's exact value (which
decides Triton's value-1, multiple-of-16 and 32/64-bit specialisations), the type of any other argument, the keyword
arguments (constexprs, num_warps, num_stages) and the current device. Under the interpreter every call goes through
the JIT (there is no compiled kernel).
"""
from __future__ import annotations

import inspect
import os

import torch

_MAX_ENTRIES = 4096        # one entry per kernel and shape; cleared when a run has seen more shapes than that
_compiled: dict[tuple, tuple] = {}


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def specialisation_key(kernel, args: tuple, kwargs: dict) -> tuple:
    """What Triton specialises ``kernel`` on for these arguments (see the module docstring), hashable."""
    spec = []
    for a in args:
        if isinstance(a, torch.Tensor):
            spec.append((a.dtype, a.data_ptr() % 16 == 0))
        elif isinstance(a, int):      # bools included: their value
            spec.append(a)
        else:
            spec.append(type(a))
    return kernel, torch.cuda.current_device(), tuple(spec), tuple(kwargs.items())


def _trailing_values(kernel, n_positional: int, kwargs: dict) -> tuple:
    """The values of the signature's parameters after the positional ones (the constexprs given by keyword, else
    their defaults), in signature order: the compiled kernel takes every parameter positionally."""
    parameters = list(inspect.signature(kernel.fn).parameters.values())[n_positional:]
    return tuple(kwargs[p.name] if p.name in kwargs else p.default for p in parameters)


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """Launch the ``triton.jit`` function ``kernel`` on ``grid`` (a tuple of 1 to 3 ints) with ``args`` and
    ``kwargs``."""
    if interpreting():
        kernel[grid](*args, **kwargs)
        return
    key = specialisation_key(kernel, args, kwargs)
    entry = _compiled.get(key)
    if entry is None:
        compiled = kernel[grid](*args, **kwargs)
        if hasattr(compiled, "result"):          # an asynchronous compilation's future (triton 3.6)
            compiled = compiled.result()
        if len(_compiled) >= _MAX_ENTRIES:
            _compiled.clear()
        _compiled[key] = (compiled, _trailing_values(kernel, len(args), kwargs))
        return
    compiled, trailing = entry
    compiled[(*grid, 1, 1)[:3]](*args, *trailing)    # the compiled kernel's runner reads grid[0], grid[1], grid[2]
