"""Initialisation (mini_of3.model.init): every residual update starts at zero and the distogram is uniform, as AF3."""
import math

import pytest
import torch

from mini_of3.losses import distogram_loss
from mini_of3.model import build_model
from mini_of3.model.transition import Transition
from structures import as_batch, read_tokens
from tiny import tiny_config


def real_inputs(seed=0):
    """s [1, N, 32] and z [1, N, N, 16] far from zero, and the token mask of 1L2Y (N = 20)."""
    batch = as_batch(read_tokens("1L2Y"))
    g = torch.Generator().manual_seed(seed)
    n = batch["token_mask"].shape[1]
    return batch, torch.randn(1, n, 32, generator=g), torch.randn(1, n, n, 16, generator=g)


def test_every_pairformer_update_is_zero_and_each_block_is_the_identity_at_init():
    torch.manual_seed(0)
    model = build_model(tiny_config(n_blocks=3))
    batch, s, z = real_inputs()
    mask = batch["token_mask"]
    pair = mask[:, :, None] & mask[:, None, :]
    block = model.pairformer.blocks[0]
    updates = {"tri_mul_out": block.tri_mul_out(z, pair), "tri_mul_in": block.tri_mul_in(z, pair),
               "tri_attn_start": block.tri_attn_start(z, pair), "tri_attn_end": block.tri_attn_end(z, pair),
               "pair_transition": block.pair_transition(z),
               "single_attention": block.single_attention(s[:, None], z, mask),
               "single_transition": block.single_transition(s)}
    for name, update in updates.items():
        assert not update.any(), name
    for block in model.pairformer.blocks:                       # bitwise: x + 0 == x
        s_out, z_out = block(s, z, mask)
        assert torch.equal(s_out, s) and torch.equal(z_out, z)
    s_out, z_out = model.pairformer(s, z, mask)                 # so the pair track keeps its scale through the stack
    assert torch.equal(z_out, z)


def test_diffusion_updates_start_as_af3():
    """Unconditioned transitions (pair and single conditioning, pLDDT head) at zero; the transformer's updates,
    conditioned on s, gated by sigmoid(-2) whatever s is (AF3's adaptive_zero_init); r_update at zero."""
    torch.manual_seed(0)
    model = build_model(tiny_config())
    transitions = [m for m in model.modules() if isinstance(m, Transition)]
    assert len(transitions) == 2 + 4 + 1                        # Pairformer block, diffusion conditioning, pLDDT
    for m in transitions:
        c = m.layer_norm.normalized_shape[0]
        assert not m(torch.randn(3, 5, c)).any()
    for block in model.diffusion.blocks:
        for gate in (block.attention.linear_s_gate, block.transition.linear_gate):
            s = torch.randn(2, 4, gate.in_features)
            torch.testing.assert_close(torch.sigmoid(gate(s)), torch.full((2, 4, gate.out_features),
                                                                          1 / (1 + math.exp(2.0))))
    assert not model.diffusion.linear_out.weight.any()


def test_distogram_logits_are_uniform_at_init():
    """Cross-entropy of a uniform guess, log(64), not worse (the default init gave 5.38 with the GPU config)."""
    torch.manual_seed(0)
    model = build_model(tiny_config(n_blocks=2))
    batch = as_batch(read_tokens("1L2Y"))
    with torch.no_grad():
        out = model(batch, n_recycles=1, generator=torch.Generator().manual_seed(0))
    logits = out["distogram_logits"]
    assert not logits.any()
    loss = distogram_loss(logits, batch["cb"], batch["token_mask"] & batch["resolved"], out["distogram_boundaries"])
    assert float(loss) == pytest.approx(math.log(64))
