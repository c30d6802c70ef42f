"""MiniOF3 end to end: the trainer's interface, recycling, checkpointing, generators, bf16 autocast."""
import pytest
import torch

from mini_of3.config import LossConfig
from mini_of3.losses import compute_losses
from mini_of3.model import MiniOF3, build_model
from tiny import perturb_zero_parameters, random_batch, tiny_config

B, N = 2, 18


def batch_with_padding():
    batch = random_batch(B, N, seed=0, chains=2)
    batch["token_mask"][1, -4:] = False
    batch["resolved"][1, -4:] = False
    batch["resolved"][0, 3] = False
    return batch


def test_forward_outputs_losses_and_gradients_reach_every_parameter():
    torch.manual_seed(0)
    model = build_model(tiny_config(diffusion_samples=3))
    assert isinstance(model, MiniOF3)
    out = model(batch_with_padding(), n_recycles=1, generator=torch.Generator().manual_seed(0))
    assert out["distogram_logits"].shape == (B, N, N, 64) and out["distogram_logits"].dtype == torch.float32
    assert out["distogram_boundaries"].shape == (63,)
    assert out["diffusion_coords"].shape == (B, 3, N, 3) and out["diffusion_sigma"].shape == (B, 3)
    assert out["plddt_logits"].shape == (B, N, 50) and out["plddt_coords"].shape == (B, N, 3)
    assert not out["plddt_coords"].requires_grad
    loss, parts = compute_losses(out, batch_with_padding(), LossConfig())
    assert loss.dim() == 0 and torch.isfinite(loss) and set(parts) == {"distogram", "diffusion", "smooth_lddt",
                                                                      "plddt"}
    assert all(not p.requires_grad for p in parts.values())
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert missing == []


def test_plddt_loss_does_not_reach_the_trunk_or_the_diffusion_module():
    torch.manual_seed(0)
    model = build_model(tiny_config())
    out = model(batch_with_padding(), n_recycles=0, generator=torch.Generator().manual_seed(0))
    _, _ = compute_losses(out, batch_with_padding(), LossConfig())
    out["plddt_logits"].sum().backward()
    with_grad = {n.split(".")[0] for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == {"plddt_head"}


def test_recycling_runs_n_gradient_free_cycles_then_one_with_gradients():
    torch.manual_seed(0)
    model = build_model(tiny_config()).eval()
    batch = batch_with_padding()
    blocks_run = []
    model.pairformer.register_forward_hook(lambda m, i, o: blocks_run.append(torch.is_grad_enabled()))
    _, s0, z0 = model.trunk(batch, n_recycles=0)
    _, s2, z2 = model.trunk(batch, n_recycles=2)
    assert blocks_run == [True, False, False, True]
    assert not torch.allclose(z0, z2)                                  # the recycled z changes the trunk output
    with pytest.raises(ValueError, match="n_recycles"):
        model.trunk(batch, n_recycles=-1)


def test_activation_checkpointing_changes_nothing_but_memory(monkeypatch):
    """All blocks, the first of two, or none recomputed: the same loss and gradients as without checkpointing."""
    import mini_of3.model.pairformer as pairformer
    recomputed, real = [], pairformer.checkpoint

    def counted(fn, block, *args, **kwargs):
        recomputed.append(block)
        return real(fn, block, *args, **kwargs)
    monkeypatch.setattr(pairformer, "checkpoint", counted)
    batch = batch_with_padding()
    grads = []
    settings = [dict(checkpointing=False), dict(checkpointing=True), dict(checkpointing=True, checkpoint_blocks=1),
                dict(checkpointing=True, checkpoint_blocks=0)]
    for setting in settings:
        torch.manual_seed(0)
        model = build_model(tiny_config(pair_dropout=0.25, n_blocks=2, **setting))
        perturb_zero_parameters(model)                                 # dropout acts on non-zero updates
        torch.manual_seed(1)                                           # the same dropout masks in every run
        recomputed.clear()
        out = model(batch, n_recycles=0, generator=torch.Generator().manual_seed(0))
        loss, _ = compute_losses(out, batch, LossConfig())
        loss.backward()
        blocks = list(model.pairformer.blocks)
        assert [blocks.index(b) for b in recomputed] == {0: [], 1: [0, 1], 2: [0], 3: []}[len(grads)]
        grads.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    for loss, named in grads[1:]:
        torch.testing.assert_close(loss, grads[0][0])
        for name, g in grads[0][1].items():
            torch.testing.assert_close(named[name], g, msg=name)
    with pytest.raises(ValueError, match=r"checkpoint_blocks: got 3, expected null or 0..model.n_blocks=2"):
        tiny_config(n_blocks=2, checkpointing=True, checkpoint_blocks=3)           # checked when the config is made


def test_generator_makes_forward_and_sample_reproducible():
    torch.manual_seed(0)
    model = build_model(tiny_config()).eval()
    batch = batch_with_padding()
    a = model(batch, n_recycles=0, generator=torch.Generator().manual_seed(5))
    b = model(batch, n_recycles=0, generator=torch.Generator().manual_seed(5))
    c = model(batch, n_recycles=0, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a["diffusion_coords"], b["diffusion_coords"])
    assert not torch.allclose(a["diffusion_sigma"], c["diffusion_sigma"])
    s1 = model.sample(batch, n_recycles=1, steps=4, samples=3, generator=torch.Generator().manual_seed(1))
    s2 = model.sample(batch, n_recycles=1, steps=4, samples=3, generator=torch.Generator().manual_seed(1))
    assert s1["coords"].shape == (B, 3, N, 3) and s1["plddt"].shape == (B, 3, N)
    assert s1["distogram_logits"].shape == (B, N, N, 64)
    assert torch.equal(s1["coords"], s2["coords"])
    assert float(s1["plddt"].min()) >= 0.0 and float(s1["plddt"].max()) <= 100.0
    assert not torch.allclose(s1["coords"][:, 0], s1["coords"][:, 1])


def test_bf16_autocast_forward_and_backward_stay_finite_with_fp32_losses():
    torch.manual_seed(0)
    model = build_model(tiny_config())
    batch = batch_with_padding()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(batch, n_recycles=1, generator=torch.Generator().manual_seed(0))
        loss, parts = compute_losses(out, batch, LossConfig())
    assert loss.dtype == torch.float32 and all(p.dtype == torch.float32 for p in parts.values())
    assert out["diffusion_coords"].dtype == torch.float32
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_build_model_rejects_bad_config():
    with pytest.raises(ValueError, match="n_heads_single"):
        build_model(tiny_config(c_s=30, n_heads_single=4))
    with pytest.raises(ValueError, match="diffusion_heads"):
        build_model(tiny_config(c_token=30, diffusion_heads=4))
    with pytest.raises(ValueError, match="tri_attn_backend"):
        build_model(tiny_config(tri_attn_backend="flash"))


def test_trunk_recycles_from_zero_without_a_zero_pair_tensor():
    """The first cycle's LinearNoBias(LayerNorm(0)) from one zero row, broadcast (AF3 SI Alg 1 lines 6-11): the trunk
    equals the cycles computed on zero tensors of the full shapes, float64, with 0 and 2 recycles."""
    torch.manual_seed(0)
    model = build_model(tiny_config()).double().eval()
    perturb_zero_parameters(model)
    batch = batch_with_padding()
    for n_recycles in (0, 2):
        with torch.no_grad():
            s_inputs, s, z = model.trunk(batch, n_recycles)
            _, s_ref, z_ref = model.embedder(batch)
            s_init, z_init = s_ref.double(), z_ref.double()
            s_prev, z_prev = torch.zeros_like(s_init), torch.zeros_like(z_init)
            for _ in range(n_recycles + 1):
                z_ref = z_init + model.linear_z_cycle(model.layer_norm_z_cycle(z_prev))
                s_ref = s_init + model.linear_s_cycle(model.layer_norm_s_cycle(s_prev))
                s_prev, z_prev = model.pairformer(s_ref, z_ref, batch["token_mask"])
        torch.testing.assert_close(z, z_prev, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(s, s_prev, rtol=1e-12, atol=1e-12)
