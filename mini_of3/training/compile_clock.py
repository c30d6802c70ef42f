"""Seconds ``torch.compile`` has spent compiling in this process, so that a budget of training-step time
(``trainer.max_minutes``) leaves compilation out.

A step that compiles trains no more than any other, but it can take a minute: the first step of a crop-ablation arm
at crop 256 took 46.7 s on the H200 (default mode, the blocks and the sampler step compiled for a new crop size), so
a budget of 0.75 minutes trained one step. Dynamo times each frame it compiles under ``_compile.compile_inner``
(tracing and the forward graph's inductor compile) and the lazy compile of a backward graph, which runs inside the
first backward, under ``backward._backward_impl``; their sum is the compile time. Recording CUDA graphs
(``trainer.compile_mode=reduce-overhead``), compiling and autotuning the Triton kernels of ``mini_of3.kernels`` on
their first call for a new size are outside dynamo and still count: a run whose crops take many sizes pays them
once per size (``data.pad_to_crop=true`` gives one).
"""
from __future__ import annotations

COMPILE_KEYS = ("_compile.compile_inner", "backward._backward_impl")


def compile_seconds() -> float:
    """Seconds spent compiling in this process so far (0 where torch keeps no such record)."""
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:
        return 0.0
    return float(sum(sum(compilation_time_metrics.get(key, ())) for key in COMPILE_KEYS))
