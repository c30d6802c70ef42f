"""One compiled function runs every block of a stack (the Pairformer's and the diffusion transformer's), and one
every step of the diffusion sampler.

``torch.compile`` of a whole training forward unrolls 12 Pairformer blocks and the pLDDT rollout's 20 denoiser calls
into one graph (minutes of compiling, recompiled per crop size). The blocks of a stack share their code, so one
compiled ``run_block(block, *inputs)`` serves them all (the parameters are the graph's inputs, not constants), with
no graph break inside a block: the attention kernels are ``torch.library`` custom ops, opaque to the compiler. The
stacks call ``run_block`` inside activation checkpointing, so the recomputation runs compiled too.
"""
from __future__ import annotations

import warnings

import torch
from torch import nn

from mini_of3.model.sampler import edm_step

# Graphs one training process needs of ``run_block``: each stack's block with and without gradients (recycling
# iterations and the pLDDT rollout run without), the checkpointed recomputation, and a dynamic-shape graph per
# variant once crops of a second size arrive; a benchmark holds several backends' blocks in one process. Dynamo's
# default of 8 graphs per function ran out in ``bench step`` with two arms (the rest of the run fell back to eager).
RECOMPILE_LIMIT = 64

# CUDA graph trees (torch 2.11) fail on blocks recomputed by non-reentrant activation checkpointing: a training step
# raised "accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run" (bench step, crop384
# model, H100, run ro1); pytorch/pytorch#154306.
CUDA_GRAPHS_WITH_CHECKPOINTING = (
    "trainer.compile_mode=reduce-overhead does not work with model.checkpointing=true (CUDA graph trees cannot "
    "replay blocks that activation checkpointing recomputes, pytorch/pytorch#154306): compiling in the default mode. "
    "Set model.checkpointing=false for CUDA graphs where the activations fit (crop 256-512 on an 80 GB GPU).")


def run_block(block: nn.Module, *inputs):
    """The eager way to run a block (what the stacks use until :func:`compile_blocks`)."""
    return block(*inputs)


def run_sampler_step(denoiser: nn.Module, context: dict, *step_inputs):
    """The eager way to run one sampler step (:func:`mini_of3.model.sampler.edm_step`) with a diffusion module's
    denoiser. Compiled, a step is one graph (augmentation, denoiser with its blocks inlined, update) instead of
    ~100 eager ops and a compiled call per block: the pLDDT rollout's 20 steps, host-bound, are the part of a
    training step where the GPU waited longest (H200, crop 768: 117-238 ms of a profiled step;
    step_crop384_acbe717_768.json)."""
    return edm_step(lambda x, t: denoiser(x, t, context), *step_inputs)


def compile_blocks(model: nn.Module, mode: str = "default") -> list[nn.Module]:
    """Give every stack in ``model`` (a module with a ``run_block`` attribute) a compiled ``run_block``, and every
    diffusion module a compiled sampler step; returns the stacks. Shapes are dynamic after the first recompilation
    (crops of other sizes reuse the graph). ``mode`` is torch.compile's: "reduce-overhead" records each graph as a
    CUDA graph and replays it (one launch instead of the graph's kernels one by one; on the CPU it compiles as
    "default"); with activation checkpointing on, it warns and compiles the blocks as "default". The sampler step
    (:func:`sampler_compile_mode`) runs as a CUDA graph on a CUDA model in either mode."""
    import torch._dynamo.config as dynamo_config
    stacks = [m for m in model.modules() if hasattr(m, "run_block")]
    block_mode = mode
    if mode == "reduce-overhead" and any(getattr(stack, "checkpointing", False) for stack in stacks):
        warnings.warn(CUDA_GRAPHS_WITH_CHECKPOINTING, stacklevel=2)
        block_mode = "default"
    parameter = next(model.parameters(), None)
    step_mode = sampler_compile_mode(mode, parameter.device if parameter is not None else torch.device("cpu"))
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
    compiled, step = torch.compile(run_block, mode=block_mode), torch.compile(run_sampler_step, mode=step_mode)
    if block_mode == "reduce-overhead":
        compiled = _copied_out_without_grad(compiled)
    if step_mode == "reduce-overhead":
        step = _copied_out_without_grad(step)
    for stack in stacks:
        _set(stack, compiled)
    for denoiser in (m for m in model.modules() if hasattr(m, "run_sampler_step")):
        _set(denoiser, step, "run_sampler_step")
    return stacks


def sampler_compile_mode(mode: str, device: torch.device) -> str:
    """The compile mode of the sampler step: "reduce-overhead" (a CUDA graph) on CUDA when ``mode`` is "default" or
    "reduce-overhead", else ``mode``. The step runs without gradients (the pLDDT rollout, sampling), so activation
    checkpointing never meets its graph; compiled in the default mode the rollout's 20 steps launched ~4,400 kernels
    one by one and the GPU sat idle for 68-70 ms of a 708-921 ms step (crop384 model, crop 768, H100), the same in
    every arm."""
    return "reduce-overhead" if device.type == "cuda" and mode in ("default", "reduce-overhead") else mode


def _copied_out_without_grad(fn):
    """``fn`` whose outputs are copied when gradients are off (validation, sampling, recycling's first cycles).

    CUDA graph trees start a new generation at every compiled call with no backward pending, and a new generation
    reuses the memory of the previous one's outputs: in ``z = block_2(block_1(z))`` or the sampler's
    ``x = step(step(x))``, the input would be an output already overwritten. With gradients on (training) every call
    of a step waits for the same backward, so outputs stay valid until it has run, and nothing is copied."""
    def call(*args):
        out = fn(*args)
        if torch.is_grad_enabled():
            return out
        return tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()
    return call


def uncompile_blocks(model: nn.Module) -> None:
    """Back to eager blocks (after a failed compilation)."""
    for stack in model.modules():
        if hasattr(stack, "run_block"):
            _set(stack, run_block)
        if hasattr(stack, "run_sampler_step"):
            _set(stack, run_sampler_step, "run_sampler_step")


def _set(stack: nn.Module, fn, name: str = "run_block") -> None:
    """A plain attribute, never a registered child (whatever ``fn`` is), so no state dict or ``.to()`` sees it."""
    object.__setattr__(stack, name, fn)
