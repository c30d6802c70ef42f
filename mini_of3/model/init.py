"""AF3's initialisation of the residual branches and output heads (AF2 SI 1.11.4 "final" init; AF3's released code).

Every residual update ``x = x + f(x)`` whose ``f`` ends in a plain linear layer starts with that layer at zero, so at
initialisation each block is the identity and the pair track keeps the scale of its embedding through the stack; the
distogram head's final linear starts at zero, so its logits are uniform. AF3's released code does this through
``GlobalConfig.final_init = 'zeros'``; updates gated by a conditioning s (``adaptive_zero_init`` in its
``diffusion_transformer.py``) instead keep the output linear and start the gate's weight at zero (bias -2), so they
begin as sigmoid(-2) ~ 0.12 times the update, whatever s is.
"""
from __future__ import annotations

from torch import nn

from mini_of3.model.attention import AttentionPairBias
from mini_of3.model.diffusion import DiffusionModule
from mini_of3.model.heads import DistogramHead
from mini_of3.model.transition import ConditionedTransitionBlock, Transition
from mini_of3.model.triangle import TriangleAttention, TriangleMultiplication


def zero_linear(linear: nn.Linear) -> None:
    """Weight and bias (if any) of ``linear`` to zero: the layer outputs zeros."""
    nn.init.zeros_(linear.weight)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)


def zeroed_layers(module: nn.Module) -> list[nn.Linear]:
    """The linear layers of ``module`` that start at zero, weight and bias (none for a module of another kind).

    Residual updates: triangle multiplication's output projection (Alg 12/13), triangle attention's (Alg 14/15),
    a transition's last linear (Alg 11: Pairformer, diffusion conditioning, pLDDT head), the single attention's
    output when unconditioned (Alg 24 in the Pairformer). Heads: the distogram's linear (SI 4.4) and the diffusion
    module's coordinate update (Alg 20, r_update).
    """
    if isinstance(module, TriangleMultiplication):
        return [module.p_out]
    if isinstance(module, TriangleAttention):
        return [module.linear_o]
    if isinstance(module, Transition):
        return [module.linear_out]
    if isinstance(module, AttentionPairBias) and not module.conditioned:
        return [module.linear_o]
    if isinstance(module, DistogramHead):
        return [module.linear]
    if isinstance(module, DiffusionModule):
        return [module.linear_out]
    return []


def output_gates(module: nn.Module) -> list[nn.Linear]:
    """The output gates of ``module``'s update conditioned on s (diffusion transformer, Alg 24 with s and Alg 25),
    whose weight starts at zero and bias at -2 (set by the module): none for a module of another kind."""
    if isinstance(module, AttentionPairBias) and module.conditioned:
        return [module.linear_s_gate]
    if isinstance(module, ConditionedTransitionBlock):
        return [module.linear_gate]
    return []


def init_final_layers(model: nn.Module) -> None:
    """Start ``model``'s residual updates and heads as AF3 does: :func:`zeroed_layers` at zero, the weights of
    :func:`output_gates` at zero (their bias, -2, is kept)."""
    for module in model.modules():
        for linear in zeroed_layers(module):
            zero_linear(linear)
        for gate in output_gates(module):
            nn.init.zeros_(gate.weight)
