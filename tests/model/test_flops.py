"""Parameter count and FLOPs per Pairformer block: the formulas against counting (parameters, FlopCounterMode)."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mini_of3.config import ModelConfig
from mini_of3.model import build_model
from mini_of3.model.flops import block_costs, print_block_costs
from tiny import tiny_config


def counted_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("cfg", [tiny_config(), ModelConfig(tri_attn_backend="torch", c_hidden_mul=96,
                                                               transition_factor=2)], ids=["tiny", "default"])
def test_block_costs_formula_matches_counted_parameters_and_flops(cfg):
    n = 10
    block = build_model(cfg).pairformer.blocks[0].eval()
    costs = block_costs(cfg, n)
    s, z = torch.randn(1, n, cfg.c_s), torch.randn(1, n, n, cfg.c_z)
    mask = torch.ones(1, n, dtype=torch.bool)
    pair = mask[:, :, None] & mask[:, None]
    calls = {
        "tri_mul_out": lambda: block.tri_mul_out(z, pair), "tri_mul_in": lambda: block.tri_mul_in(z, pair),
        "tri_attn_start": lambda: block.tri_attn_start(z, pair), "tri_attn_end": lambda: block.tri_attn_end(z, pair),
        "pair_transition": lambda: block.pair_transition(z),
        "single_attention": lambda: block.single_attention(s[:, None], z, mask),
        "single_transition": lambda: block.single_transition(s),
    }
    for name, call in calls.items():
        module = getattr(block, name)
        assert costs[name]["params"] == sum(p.numel() for p in module.parameters()), name
        assert costs[name]["flops"] == counted_flops(call), name
    assert costs["block"]["params"] == sum(p.numel() for p in block.parameters())
    assert costs["block"]["flops"] == counted_flops(lambda: block(s, z, mask))


def test_print_block_costs(capsys):
    cfg = ModelConfig()
    print_block_costs(cfg, 384)
    text = capsys.readouterr().out
    assert "block" in text and f"{block_costs(cfg, 384)['block']['params']:,}" in text
    # the O(N^3) terms dominate at large N: triangle attention is 4 N^3 H D per node
    big = block_costs(cfg, 768)
    assert big["tri_attn_start"]["flops"] > 4 * 768 ** 3 * 4 * 32
