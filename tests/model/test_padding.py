"""Padding invariance: padded tokens change no real token's output and no gradient.

In float64: with padding, the model's sums run over 25 tokens instead of 20 and round differently, in float32 by up
to a few 1e-5 of an element, and how much depends on the CPU's vector kernels. In float64 that rounding is ~1e-16
relative, so a tight bound on the norm-relative error holds on any machine and still catches a leak (one padded
token left unmasked moves the outputs and gradients by about 0.2 relative).
"""
import torch

from mini_of3.model import build_model
from structures import as_batch, read_tokens
from tiny import double_batch, pad_batch, perturb_zero_parameters, relative_error, tiny_config

N_EXTRA = 5
REL = 1e-10                     # float64 rounding of these sums is ~1e-15 relative


def real_outputs(model, batch, x_real, n):
    """Trunk, distogram, denoiser and pLDDT outputs of the first n tokens, and a scalar that mixes them all."""
    B, N = batch["token_mask"].shape
    g = torch.Generator().manual_seed(1)
    junk = 50 * torch.randn(B, 2, N - n, 3, generator=g, dtype=x_real.dtype)
    x = torch.cat([x_real, junk], dim=2) if N > n else x_real
    s_inputs, s, z = model.trunk(batch, n_recycles=1)
    logits = model.distogram_head(z)
    context = model.diffusion.prepare(batch, s_inputs, s, z)
    denoised = model.diffusion(x, torch.tensor([[3.0, 40.0]], dtype=x.dtype), context)
    plddt = model.plddt_head(s, z, x, batch["token_mask"])
    outs = {"s": s[:, :n], "z": z[:, :n, :n], "distogram": logits[:, :n, :n], "denoised": denoised[:, :, :n],
            "plddt": plddt[:, :, :n]}
    w = torch.Generator().manual_seed(2)
    scalar = sum((v * torch.randn(v.shape, generator=w, dtype=v.dtype)).sum() for v in outs.values())
    return outs, scalar


def test_padded_tokens_change_no_real_output_or_gradient():
    torch.manual_seed(0)
    model = perturb_zero_parameters(build_model(tiny_config(n_blocks=2))).double().eval()   # every update non-zero
    batch = double_batch(as_batch(read_tokens("1L2Y")))
    n = batch["restype"].shape[1]
    x_real = batch["ca"][:, None].expand(1, 2, n, 3) + torch.randn(1, 2, n, 3, dtype=torch.float64)
    params = [p for p in model.parameters()]

    outs, scalar = real_outputs(model, batch, x_real, n)
    grads = torch.autograd.grad(scalar, params, allow_unused=True)
    padded = pad_batch(batch, N_EXTRA)
    outs_pad, scalar_pad = real_outputs(model, padded, x_real, n)
    grads_pad = torch.autograd.grad(scalar_pad, params, allow_unused=True)

    for key in outs:
        assert outs[key].dtype == torch.float64, key
        assert relative_error(outs_pad[key], outs[key]) < REL, (key, relative_error(outs_pad[key], outs[key]))
    names = [name for name, _ in model.named_parameters()]
    total = float(torch.cat([g.flatten() for g in grads if g is not None]).norm())
    for name, g, g_pad in zip(names, grads, grads_pad):
        if g is None:
            assert g_pad is None, name
            continue
        # relative to the whole gradient: some tensors' gradients are zero up to rounding (a LayerNorm bias that
        # feeds a softmax bias only: softmax ignores a shift), so their own norm is no scale
        assert relative_error(g_pad, g, total) < REL, (name, relative_error(g_pad, g, total))
    assert sum(g is not None for g in grads) > 0.9 * len(params)


def test_masking_padded_queries_changes_no_real_output_of_a_pairformer_block():
    """The triangle attentions mask the padded pairs as queries too (``mask_queries``, on by default: their updates
    are 0 and the kernels skip them). A Pairformer block (AF3 SI Alg 17) on an entry with 5 padded tokens, float64:
    the real tokens' s and z, and the gradients of every parameter and of the inputs' real entries, are the same with
    it on and off; with it on the padded pairs' attention updates are exactly 0, with it off they are not."""
    from mini_of3.model.pairformer import PairformerBlock
    torch.manual_seed(0)
    block = PairformerBlock(c_s=16, c_z=8, n_heads_tri=2, c_hidden_tri=16, n_heads_single=2, c_hidden_mul=8,
                            transition_factor=2, pair_dropout=0.0)
    block = perturb_zero_parameters(block).double()
    n, N = 9, 9 + N_EXTRA
    mask = torch.arange(N)[None] < n                                                 # [1, N]
    s0, z0 = torch.randn(1, N, 16, dtype=torch.float64), 3 * torch.randn(1, N, N, 8, dtype=torch.float64)
    w = torch.Generator().manual_seed(2)
    ws, wz = (torch.randn(shape, generator=w, dtype=torch.float64) for shape in ((1, n, 16), (1, n, n, 8)))
    results = []
    for mask_queries in (True, False):
        block.tri_attn_start.mask_queries = block.tri_attn_end.mask_queries = mask_queries
        s, z = s0.clone().requires_grad_(True), z0.clone().requires_grad_(True)
        s_out, z_out = block(s, z, mask)
        scalar = (s_out[:, :n] * ws).sum() + (z_out[:, :n, :n] * wz).sum()
        grads = torch.autograd.grad(scalar, [s, z, *block.parameters()])
        pair_mask = mask[:, :, None] & mask[:, None, :]
        padded_update = block.tri_attn_start(z0, pair_mask)[~pair_mask]
        results.append((s_out[:, :n], z_out[:, :n, :n], grads[0][:, :n], grads[1][:, :n, :n], *grads[2:]))
        assert (torch.count_nonzero(padded_update) == 0) == mask_queries
    total = float(torch.cat([g.flatten() for g in results[1][2:]]).norm())
    for i, (on, off) in enumerate(zip(*results)):
        assert relative_error(on, off, total if i >= 2 else None) < REL, (i, relative_error(on, off))
