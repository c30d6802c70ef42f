"""Host-side helpers shared by every fused op of the kernel room: launch, allocation, sizes, tiles, dispatch.

    launch(kernel, grid, *args, **kwargs)        what kernel[grid](*args, **kwargs) does, with less host time
    allocate(shape, dtype, device)               an output buffer (NaN-filled under MINI_OF3_POISON=1)
    TileOverride(name, tiles_type)               ``with override(field=value)``: an op's tiles instead of its defaults
    eager_function(...)                          an op's eager autograd path, without torch.library's dispatch
    dispatch(op, eager, forward, inputs, needs_grad)   the one call path: compiled, eager with gradients, inference

An op module (``<op>.py``: checks, custom ops, public function) and its launchers (``<op>_host.py``) import from
here; its Triton kernels (``<op>_kernels.py``) import the device-side helpers of ``primitives.py``.

The launch: ``kernel[grid](...)`` binds every argument to the kernel's signature and rebuilds its specialisation key
on each call, ~0.1 ms of host time per launch on the H100 machine's CPU (cProfile, N = 64). Here the first call of a
key goes through the JIT, which compiles the kernel or finds it in its caches, launches it and returns the compiled
kernel; later calls of the key launch that compiled kernel directly (``CompiledKernel[grid](*args)``, as the JIT
itself does). The key holds everything Triton specialises a kernel on, so that a key never maps to a kernel compiled
for other arguments: each tensor's dtype and whether its data pointer is 16-byte aligned, every integer's exact value
(which decides Triton's value-1, multiple-of-16 and 32/64-bit specialisations), the type of any other argument, the
keyword arguments (constexprs, num_warps, num_stages) and the current device; a Gluon TMA descriptor by its
dtype, block shape, shared layout and padding (the kernel's type for it; its base, shape and strides are runtime).
Under the interpreter every call goes through the JIT (there is no compiled kernel).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os

import torch

BACKENDS = ("auto", "triton", "torch")   # the ``backend=`` of every op: auto = triton where the kernel takes the
                                         # call (CUDA tensors of a shape and dtype it supports), else torch
# torch.mm / torch.bmm take out_dtype (float32 from 16-bit inputs, CUDA) from torch 2.8 on
_GEMM_OUT_DTYPE = torch.torch_version.TorchVersion(torch.__version__) >= "2.8"
_MAX_ENTRIES = 4096        # one entry per kernel and shape; cleared when a run has seen more shapes than that
_compiled: dict[tuple, tuple] = {}


# ---------------------------------------------------------------------------------------------------------------
# the launch


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
        elif hasattr(a, "block_shape") and hasattr(a, "layout"):   # a Gluon TMA descriptor: what its type names
            spec.append((a.base.dtype, tuple(a.block_shape), repr(a.layout), a.padding))
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


# ---------------------------------------------------------------------------------------------------------------
# buffers, sizes and precision


def allocate(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A buffer for a kernel to write; MINI_OF3_POISON=1 (debugging, the tests) fills it with NaN, so that a test
    sees any element a kernel did not write."""
    if os.environ.get("MINI_OF3_POISON", "0") == "1":
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def stacked(tensors, dtype: torch.dtype) -> torch.Tensor:
    """The rows of ``tensors`` (same width) one after another in one new tensor of ``dtype``, cast by one cat: the
    weights in the compute dtype that a forward keeps for its backward (an op's outputs may not alias its inputs,
    so even a weight already in that dtype is copied)."""
    rows = sum(t.shape[0] for t in tensors)
    return torch.cat(tensors, out=allocate((rows, *tensors[0].shape[1:]), dtype, tensors[0].device))


def pow2(n: int) -> int:
    """The next power of two >= n (n >= 1): triton.next_power_of_2 in plain Python; Triton's (3.9) is a constexpr
    function whose wrapper costs the host microseconds per call, a dozen calls in every forward and backward."""
    return 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for launch grids: triton.cdiv in plain Python (see pow2)."""
    return -(-a // b)


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 4 elsewhere (the interpreter)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def persistent_programs(tiles: int, per_sm: int, device: torch.device, *, balanced: bool = False) -> int:
    """Programs of a persistent grid over ``tiles`` work items: ``per_sm`` per SM (0: one per tile), never more
    than the tiles; ``balanced``: as few as give every program the same number of tiles (at most one less). Two
    under the interpreter, so that the tests' programs take several tiles each."""
    if interpreting():
        return min(tiles, 2)
    if per_sm == 0:
        return tiles
    programs = min(tiles, per_sm * num_sms(device))
    return cdiv(tiles, cdiv(tiles, programs)) if balanced else programs


def dot_precision(dtype: torch.dtype) -> str:
    """The kernels' DOT_PREC: float32 inputs multiply in IEEE float32; 16-bit inputs ignore it; the interpreter
    ("upcast") multiplies 16-bit values in float32, since its bf16 dot is wrong in triton 3.9."""
    if interpreting():
        return "upcast"
    return "ieee" if dtype == torch.float32 else "tf32"


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype an op computes and returns in: autocast's when it is on for x's device (as the eager layers under
    autocast), else x's."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype


def weight_grad(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """sum_batch a @ b for [B, M, K] @ [B, K, P] in the compute dtype, cast to ``dtype``: a weight gradient (K the
    rows or pairs). On CUDA cuBLAS writes float32 itself (``out_dtype``), one GEMM and no other kernel when B = 1;
    elsewhere the product is rounded to the compute dtype first, then summed over the batch in float32, in order."""
    if _GEMM_OUT_DTYPE and a.is_cuda and a.dtype in (torch.bfloat16, torch.float16):
        if a.shape[0] == 1:
            return torch.mm(a[0], b[0], out_dtype=torch.float32).to(dtype)
        return torch.bmm(a, b, out_dtype=torch.float32).sum(0).to(dtype)
    return torch.matmul(a, b).float().sum(0).to(dtype)


# ---------------------------------------------------------------------------------------------------------------
# backend choice


def check_backend(op: str, backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"{op}: backend must be one of {BACKENDS}, got {backend!r}")


def resolve_backend(op: str, backend: str, kernel_takes: bool, x: torch.Tensor) -> str:
    """"triton" or "torch" for a call: ``auto`` is the kernel where it takes the call (``kernel_takes``), else
    torch; ``triton`` needs CUDA tensors or the interpreter (the op checks its shapes and dtypes itself)."""
    if backend == "auto":
        return "triton" if kernel_takes else "torch"
    if backend == "triton" and not x.is_cuda and not interpreting():
        raise ValueError(f"{op}: backend='triton' needs CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set "
                         f"before mini_of3 is imported")
    return backend


# ---------------------------------------------------------------------------------------------------------------
# tiles


class TileOverride:
    """Tiles of one fused op set for a while instead of its defaults: ``with override(field=value, ...)`` applies to
    every call in the process meanwhile, backward included (a process-wide setting, not a context variable: the
    backward runs on autograd's thread); ``override.apply(tiles)`` gives the tiles of a call. While any override is
    in force (``active``, even ``with override():`` with no field) an op that autotunes launches its fixed tiles
    instead. The tuning scripts sweep tiles this way."""

    def __init__(self, name: str, tiles_type: type) -> None:
        self.name, self.tiles_type = name, tiles_type
        self.fields: dict | None = None      # None: no override in force

    @property
    def active(self) -> bool:
        return self.fields is not None

    @contextlib.contextmanager
    def __call__(self, **fields):
        unknown = set(fields) - {f.name for f in dataclasses.fields(self.tiles_type)}
        if unknown:
            raise ValueError(f"{self.name}: unknown fields {sorted(unknown)}")
        saved = self.fields
        self.fields = {**(saved or {}), **fields}
        try:
            yield
        finally:
            self.fields = saved

    def apply(self, tiles):
        return dataclasses.replace(tiles, **self.fields) if self.fields else tiles

    def cached(self, tiles_of):
        """``tiles_of(*shape)`` (the tiles of a call, built from the defaults and ``apply``) memoised per shape,
        interpreter on or off, and the override in force: a call then looks its tiles up instead of building two
        dataclasses (~12 µs of host time per call on a 2-core CPU)."""
        cache = {}

        @functools.wraps(tiles_of)
        def lookup(*shape):
            key = (shape, interpreting(), self.active, tuple(sorted((self.fields or {}).items())))
            if key not in cache:
                cache[key] = tiles_of(*shape)
            return cache[key]
        return lookup


# ---------------------------------------------------------------------------------------------------------------
# the call path: custom ops for torch.compile, an autograd.Function for eager calls


def eager_function(name: str, forward, setup_context, autograd_backward, backward) -> type:
    """The eager path of a custom op pair: an autograd.Function that calls the op's Python ``forward`` and
    ``backward`` directly, without torch.library's dispatch (~80 µs per forward + backward on a 2-core CPU, ~40 % of
    a small call's host time), wired with the same ``setup_context`` and ``autograd_backward(ctx, *grads,
    backward_fn=...)`` as the op's autograd. ``forward`` takes the forward op's arguments, ``backward`` the backward
    op's."""

    def eager_forward(ctx, *inputs):
        output = forward(*inputs)
        setup_context(ctx, inputs, output)
        return output

    def eager_backward(ctx, *grads):
        return autograd_backward(ctx, *grads, backward_fn=backward)

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(eager_forward),
                                                    "backward": staticmethod(eager_backward)})


def dispatch(op, eager: type, forward, inputs: tuple, needs_grad: bool):
    """The outputs of a fused op's forward on ``inputs`` (the forward op's arguments): under torch.compile the
    custom op ``op`` (opaque to the compiler, its fake implementation traced); in eager mode with gradients the
    ``eager`` autograd.Function; without gradients ``forward`` itself (no autograd node, ~10 µs less)."""
    if torch.compiler.is_compiling():
        return op(*inputs)
    if needs_grad:
        return eager.apply(*inputs)
    return forward(*inputs)


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd will want the gradient of any of ``tensors`` (grad mode on and one requires it)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
