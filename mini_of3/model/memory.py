"""How much memory a prediction needs at least: the largest tensors that are alive at once, counted from the shapes.

A lower bound, not a forecast: a prediction it refuses cannot run; one it allows may still run out. Counted in
float32: the pair representation ``z [N, N, c_z]`` and its update, the triangle multiplication's projections
``[N, N, 2 c_hidden_mul]``, and, where attention runs in PyTorch (the CPU), the attention scores: the triangle
attention's ``[N, H, N, N]`` (AF3 SI Alg 14/15) and the diffusion transformer's ``[samples, H, N, N]`` (Alg 24).
Our GPU kernels keep no score matrix in memory.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..config import ModelConfig

FLOAT32 = 4


def inference_bytes(cfg: ModelConfig, n_tokens: int, samples: int, device: torch.device) -> int:
    """A lower bound of the peak memory of predicting ``n_tokens`` tokens with ``samples`` samples on ``device``."""
    n2 = n_tokens * n_tokens
    pair = FLOAT32 * n2 * cfg.c_z
    largest = FLOAT32 * n2 * 2 * cfg.c_hidden_mul
    if device.type != "cuda":
        largest = max(largest, FLOAT32 * cfg.n_heads_tri * n2 * n_tokens, FLOAT32 * samples * cfg.diffusion_heads * n2)
    return 2 * pair + largest


def available_bytes(device: torch.device) -> int | None:
    """Memory free for a new allocation on ``device``: the GPU's free memory, or the host's available memory
    (``MemAvailable``); None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
