"""LayerNorm that keeps autocast's 16-bit dtype: same values as float32 LayerNorm rounded once, same parameters."""
import torch
from torch import nn

from mini_of3.model.norm import LayerNorm
from tiny import relative_error

BF16_EPS = 2.0 ** -8          # the spacing of bf16 around 1: the rounding of one output


def make_pair(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ours, plain = LayerNorm(24), nn.LayerNorm(24)
    with torch.no_grad():
        for p in (*ours.parameters(), *plain.parameters()):
            p.copy_(torch.randn(p.shape, generator=g))
    plain.load_state_dict(ours.state_dict())
    x = (torch.randn(3, 5, 7, 24, generator=g) * 3 + 1).requires_grad_(True)
    return ours, plain, x


def test_without_autocast_it_is_nn_layer_norm_bitwise():
    ours, plain, x = make_pair()
    assert torch.equal(ours(x), plain(x))
    assert set(dict(ours.named_parameters())) == {"weight", "bias"}


def test_under_autocast_a_bf16_input_stays_bf16_and_matches_float32_rounded_once():
    ours, plain, x = make_pair(1)
    x16 = x.detach().bfloat16().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ours(x16)
    widened = plain(x16.detach().float())            # what CUDA autocast runs: float32 in and out
    assert out.dtype == torch.bfloat16
    # one bf16 rounding of the output and of the affine weights: a few bf16 epsilons, norm-relative
    assert relative_error(out.float(), widened) < 4 * BF16_EPS
    out.float().square().sum().backward()
    assert ours.weight.grad.dtype == torch.float32 and x16.grad.dtype == torch.bfloat16
    assert ours.weight.grad.abs().sum() > 0 and ours.bias.grad.abs().sum() > 0


def test_under_autocast_a_float32_input_is_left_to_autocast():
    ours, plain, x = make_pair(2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(ours(x), plain(x))
