"""Padding invariance: padded tokens change no real token's output and no gradient."""
import torch

from mini_of3.model import build_model
from structures import as_batch, read_tokens
from tiny import pad_batch, perturb_zero_parameters, tiny_config

N_EXTRA = 5


def real_outputs(model, batch, x_real, n):
    """Trunk, distogram, denoiser and pLDDT outputs of the first n tokens, and a scalar that mixes them all."""
    B, N = batch["token_mask"].shape
    g = torch.Generator().manual_seed(1)
    x = torch.cat([x_real, 50 * torch.randn(B, 2, N - n, 3, generator=g)], dim=2) if N > n else x_real
    s_inputs, s, z = model.trunk(batch, n_recycles=1)
    logits = model.distogram_head(z)
    context = model.diffusion.prepare(batch, s_inputs, s, z)
    denoised = model.diffusion(x, torch.tensor([[3.0, 40.0]]), context)
    plddt = model.plddt_head(s, z, x, batch["token_mask"])
    outs = {"s": s[:, :n], "z": z[:, :n, :n], "distogram": logits[:, :n, :n], "denoised": denoised[:, :, :n],
            "plddt": plddt[:, :, :n]}
    w = torch.Generator().manual_seed(2)
    scalar = sum((v * torch.randn(v.shape, generator=w)).sum() for v in outs.values())
    return outs, scalar


def test_padded_tokens_change_no_real_output_or_gradient():
    torch.manual_seed(0)
    model = perturb_zero_parameters(build_model(tiny_config(n_blocks=2))).eval()   # every update non-zero
    batch = as_batch(read_tokens("1L2Y"))
    n = batch["restype"].shape[1]
    x_real = batch["ca"][:, None].expand(1, 2, n, 3) + torch.randn(1, 2, n, 3)
    params = [p for p in model.parameters()]

    outs, scalar = real_outputs(model, batch, x_real, n)
    grads = torch.autograd.grad(scalar, params, allow_unused=True)
    padded = pad_batch(batch, N_EXTRA)
    outs_pad, scalar_pad = real_outputs(model, padded, x_real, n)
    grads_pad = torch.autograd.grad(scalar_pad, params, allow_unused=True)

    for key in outs:
        torch.testing.assert_close(outs_pad[key], outs[key], rtol=1e-4, atol=1e-5, msg=key)
    names = [name for name, _ in model.named_parameters()]
    for name, g, g_pad in zip(names, grads, grads_pad):
        if g is None:
            assert g_pad is None, name
            continue
        # float32 sums over N^2 pairs in another order: errors scale with the tensor's largest entry (~400 here),
        # where a leak from padding would be of the order of the gradient itself
        torch.testing.assert_close(g_pad, g, rtol=1e-4, atol=1e-5 + 1e-6 * float(g.abs().max()), msg=name)
    assert sum(g is not None for g in grads) > 0.9 * len(params)
