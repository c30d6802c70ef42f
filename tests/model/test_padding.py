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
