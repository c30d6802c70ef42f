"""Compiling the model's repeated blocks for training, with eager blocks as the fallback."""
from __future__ import annotations

import warnings
from typing import Callable

import torch

from ..config import Config
from ..model.compiled import compile_blocks, uncompile_blocks


def compile_with_probe(model: torch.nn.Module, cfg: Config, probe: Callable[[], None],
                       say: Callable[[str], None]) -> bool:
    """Compile ``model``'s blocks (:func:`mini_of3.model.compiled.compile_blocks`: one graph for all Pairformer
    blocks, one for the diffusion transformer's, one for a step of the sampler) and run ``probe`` (a forward and
    backward on a real example) so that compiling fails here, not in the first step. On any compiler failure, warn
    and go back to eager blocks; later failures of single graphs fall back to eager too (suppress_errors). Running
    out of memory is not a compiler failure and propagates. Returns whether the blocks are compiled."""
    import torch._dynamo
    torch._dynamo.config.suppress_errors = True
    if cfg.trainer.compile_mode == "reduce-overhead" and not cfg.data.pad_to_crop:
        say("trainer.compile_mode=reduce-overhead records new CUDA graphs for every new crop length: "
            "data.pad_to_crop=true gives every step the same shape")
    try:
        compile_blocks(model, cfg.trainer.compile_mode)
        probe()
    except torch.OutOfMemoryError:
        raise
    except Exception as err:                             # noqa: BLE001 - any compiler failure means eager
        uncompile_blocks(model)
        torch._dynamo.reset()
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        warnings.warn(f"trainer.compile=true: torch.compile failed ({type(err).__name__}: {first}); training "
                      f"without compiling")
        return False
    say("trainer.compile: the Pairformer and diffusion blocks and the sampler step are compiled")
    return True
