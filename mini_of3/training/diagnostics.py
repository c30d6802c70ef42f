"""What a training step reports beside its loss: the sums each micro-batch contributes, their reduction over ranks,
the gradient norm of each part of the model, and the step's log row.

A micro-batch contributes one float64 vector (:func:`micro_batch_sums`) laid out by :data:`SUMS`; the trainer adds
them over micro-batches and all-reduces the vector once per step, and :func:`step_report` reads the parts back by
name.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..losses import LOSS_PARTS, SIGMA_BIN_NAMES, diffusion_loss_by_sigma, rollout_confidence_sums
from .process import Process

# the modules whose gradient norms every log row holds (``grad_norm/<name>``), by the model's top-level children;
# the recycling projections are the trunk's input, so they count with the embedder
MODULES = {"embedder": ("embedder", "layer_norm_z_cycle", "linear_z_cycle", "layer_norm_s_cycle", "linear_s_cycle"),
           "pairformer": ("pairformer",), "distogram_head": ("distogram_head",), "diffusion": ("diffusion",),
           "plddt_head": ("plddt_head",)}

# the named parts of a micro-batch's sums vector, in order, and their lengths
SUMS = {"loss": 1, "parts": len(LOSS_PARTS), "sigma_sums": len(SIGMA_BIN_NAMES),
        "sigma_counts": len(SIGMA_BIN_NAMES), "rollout": 3}
SUMS_SIZE = sum(SUMS.values())


def micro_batch_sums(loss: torch.Tensor, parts: dict[str, torch.Tensor], outputs: dict, batch: dict) -> torch.Tensor:
    """``[SUMS_SIZE]`` float64 on the CPU: the loss, its parts, the diffusion loss sums and sample counts per noise
    bin (:func:`mini_of3.losses.diffusion_loss_by_sigma`), and the pLDDT rollout's target and predicted lDDT sums
    and structure count (:func:`mini_of3.losses.rollout_confidence_sums`)."""
    return torch.cat([torch.stack([loss.detach(), *(parts[p] for p in LOSS_PARTS)]).double().cpu(),
                      *diffusion_loss_by_sigma(outputs, batch), rollout_confidence_sums(outputs, batch)])


def step_report(reduced: torch.Tensor, micro_batches: int) -> tuple[dict[str, float], dict[str, float]]:
    """(losses, diagnostics) of a step from its sums over all micro-batches of all ranks: losses ``{"loss", *parts}``
    are means over the ``micro_batches``; diagnostics the diffusion loss per noise bin (``diffusion/sigma<bin>``,
    NaN where no sample fell) and the rollout's mean target and predicted lDDT (``rollout_lddt``, ``rollout_plddt``)."""
    named = dict(zip(SUMS, torch.split(reduced, list(SUMS.values()))))
    means = (torch.cat([named["loss"], named["parts"]]) / micro_batches).tolist()
    losses = dict(zip(("loss", *LOSS_PARTS), means))
    by_sigma = {f"diffusion/sigma{name}": float(s / c) if c > 0 else float("nan")
                for name, s, c in zip(SIGMA_BIN_NAMES, named["sigma_sums"], named["sigma_counts"])}
    target, predicted, count = named["rollout"].tolist()
    rollout = {"rollout_lddt": target / count if count > 0 else float("nan"),
               "rollout_plddt": predicted / count if count > 0 else float("nan")}
    return losses, {**by_sigma, **rollout}


def module_parameters(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """The parameters of each of :data:`MODULES` (a model without one of them gets an empty list)."""
    children = dict(model.named_children())
    return {name: [p for child in parts if child in children for p in children[child].parameters()]
            for name, parts in MODULES.items()}


def module_grad_norms(module_params: dict[str, list[nn.Parameter]], device: torch.device,
                      reduce_shards: Callable[[torch.Tensor], torch.Tensor] | None = None,
                      grad_scale: float = 1.0) -> dict[str, float]:
    """``{"grad_norm/<module>": norm}`` of the accumulated gradients of each module, before clipping.

    Under FSDP2 gradients are shards (DTensors): each rank squares its own and ``reduce_shards`` sums the squares;
    under fp16 the gradients are still scaled by ``grad_scale``."""
    squares = torch.zeros(len(module_params), dtype=torch.float64, device=device)
    for k, params in enumerate(module_params.values()):
        grads = [p.grad for p in params if p.grad is not None]
        grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        if grads:                         # one multi-tensor launch per dtype, not one per parameter
            norms = torch._foreach_norm(grads, 2, dtype=torch.float32)
            squares[k] = torch.stack(norms).double().square().sum()
    if reduce_shards is not None:
        squares = reduce_shards(squares)
    norms = squares.sqrt().cpu() / grad_scale
    return {f"grad_norm/{name}": float(v) for name, v in zip(module_params, norms)}


def global_ids(proc: Process, ids: list[list[str]]) -> list[str]:
    """The entry ids of the step's global batch in the sampler's stream order, from ``ids`` (this rank's, per
    micro-batch): micro-batch, then position in it, then rank (a collective when there are several ranks)."""
    per_rank = proc.gather([ids]) if proc.world > 1 else [ids]
    return [rank[micro][b] for micro in range(len(ids)) for b in range(len(ids[micro])) for rank in per_rank]
