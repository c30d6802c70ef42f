"""Parameters and forward FLOPs of one Pairformer block, from closed-form formulas (nanoGPT's estimate_mfu spirit).

FLOPs are matrix-multiply FLOPs (2 per multiply-add) of the forward pass for one structure of N tokens, the work
that dominates and that ``torch.utils.flop_counter`` counts; forward + backward is about 3x (3.5x for attention with
one recomputation, docs/design.md). Run ``python -m mini_of3.model.flops [N]`` for the table at the default config.
"""
from __future__ import annotations

import argparse

from mini_of3.config import ModelConfig


def block_costs(cfg: ModelConfig, n_tokens: int) -> dict[str, dict[str, int]]:
    """Parameters and forward matmul FLOPs of each sub-layer of one Pairformer block (AF3 SI Alg 17).

    Returns {sub-layer: {"params": int, "flops": int}} for tri_mul_out, tri_mul_in, tri_attn_start,
    tri_attn_end, pair_transition, single_attention, single_transition, and "block" (their sum).
    """
    n, cz, cs, f = n_tokens, cfg.c_z, cfg.c_s, cfg.transition_factor
    h = cfg.c_hidden_mul
    ht, dt = cfg.n_heads_tri, cfg.c_hidden_tri
    hs = cfg.n_heads_single
    pairs = n * n

    tri_mul = {
        # LayerNorm in (2 c_z), p_in and g_in (2h x c_z each), LayerNorm out (2h), p_out (c_z x h), g_out (c_z^2)
        "params": 2 * cz + 4 * h * cz + 2 * h + h * cz + cz * cz,
        # p_in, g_in, p_out, g_out per pair; sum over k of a_ik b_jk: N^3 h multiply-adds
        "flops": 2 * pairs * (4 * cz * h + h * cz + cz * cz) + 2 * n ** 3 * h,
    }
    tri_attn = {
        # LayerNorm (2 c_z), q k v g (c_z x H D each), bias (c_z x H), output (H D x c_z)
        "params": 2 * cz + 5 * cz * ht * dt + cz * ht,
        # projections per pair; scores and weighted sum: 4 N^3 H D (docs/design.md)
        "flops": 2 * pairs * (5 * cz * ht * dt + cz * ht) + 4 * n ** 3 * ht * dt,
    }
    pair_transition = {"params": 2 * cz + 3 * f * cz * cz, "flops": 2 * pairs * 3 * f * cz * cz}
    single_attention = {
        # LayerNorm a (2 c_s), q with bias, k v g o (c_s^2 each), LayerNorm z (2 c_z), bias (c_z x H)
        "params": 2 * cs + 5 * cs * cs + cs + 2 * cz + cz * hs,
        "flops": 2 * n * 5 * cs * cs + 2 * pairs * cz * hs + 4 * pairs * cs,
    }
    single_transition = {"params": 2 * cs + 3 * f * cs * cs, "flops": 2 * n * 3 * f * cs * cs}
    costs = {"tri_mul_out": tri_mul, "tri_mul_in": dict(tri_mul), "tri_attn_start": tri_attn,
             "tri_attn_end": dict(tri_attn), "pair_transition": pair_transition,
             "single_attention": single_attention, "single_transition": single_transition}
    costs["block"] = {key: sum(c[key] for c in costs.values()) for key in ("params", "flops")}
    return costs


def format_block_costs(cfg: ModelConfig, n_tokens: int) -> str:
    """A readable table of ``block_costs``."""
    costs = block_costs(cfg, n_tokens)
    lines = [f"Pairformer block at N={n_tokens}, c_s={cfg.c_s}, c_z={cfg.c_z}, tri attn {cfg.n_heads_tri}x"
             f"{cfg.c_hidden_tri}, tri mul hidden {cfg.c_hidden_mul}, single heads {cfg.n_heads_single}",
             f"{'sub-layer':<18}{'params':>12}{'fwd GFLOP':>12}{'share':>8}"]
    total = costs["block"]["flops"]
    for name, c in costs.items():
        lines.append(f"{name:<18}{c['params']:>12,}{c['flops'] / 1e9:>12.2f}{c['flops'] / total:>8.1%}")
    return "\n".join(lines)


def print_block_costs(cfg: ModelConfig | None = None, n_tokens: int = 384) -> None:
    """Print the parameter count and forward FLOPs per Pairformer block."""
    print(format_block_costs(cfg or ModelConfig(), n_tokens))


def main(argv: list[str] | None = None) -> None:
    """``python -m mini_of3.model.flops [N ...]``: the table at the default config for each crop size N."""
    parser = argparse.ArgumentParser(prog="python -m mini_of3.model.flops",
                                     description="Parameters and forward matmul FLOPs of one Pairformer block at the "
                                                 "default config (c_s 384, c_z 128), per sub-layer.")
    parser.add_argument("n_tokens", nargs="*", type=int, default=[256, 384, 768], help="crop sizes N")
    for n_tokens in parser.parse_args(argv).n_tokens:
        print_block_costs(ModelConfig(), n_tokens)
        print()


if __name__ == "__main__":
    main()
