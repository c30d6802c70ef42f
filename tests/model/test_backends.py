"""Kernel backends inside the model: mini_of3 (Triton; interpreter on CPU) equals torch; adapters map layouts."""
import importlib.util
import math
import os

import pytest
import torch

import mini_of3.model.tri_attn_backends as tab
import mini_of3.model.tri_mul_backends as tmb
from mini_of3.config import ConfigError, LossConfig, ModelConfig, load_config
from mini_of3.kernels import triangle_attention_ref
from mini_of3.losses import compute_losses
from mini_of3.model import build_model
from mini_of3.model.kernel_choice import KernelChoice
from mini_of3.model.tri_attn_backends import tri_attn_backend
from mini_of3.model.triangle import TriangleAttention, TriangleMultiplication
from structures import as_batch, read_tokens
from tiny import perturb_zero_parameters, relative_error, tiny_config

triton_available = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") == "1"
# Two float32 computations of the same function that sum in different orders (another kernel, another layout) differ
# by a few float32 epsilons in the norm-relative error (measured: up to 4e-7, about 3 eps, on this model); 2**7 eps
# (1.5e-5) bounds that on any CPU, while a wrong mask, scale or layout gives errors of order 1e-2 and more. A norm, not
# an elementwise tolerance: single elements near zero round differently on each CPU's vector kernels.
REL32 = 2 ** 7 * torch.finfo(torch.float32).eps


@pytest.mark.skipif(not triton_available, reason="needs CUDA or TRITON_INTERPRET=1 (set by tests/conftest.py)")
@pytest.mark.parametrize("tri_mul", ["auto", "mini_of3"])
def test_model_on_mini_of3_kernel_equals_torch_path_forward_and_gradients(monkeypatch, tri_mul):
    """Tiny model (N = 20, c_z 16, one block, head dims 16): every attention of the trunk and the diffusion
    module runs on our Triton kernel (and, with tri_mul = mini_of3, both triangle multiplications and the pair
    transition on theirs); outputs, losses and every parameter gradient match the torch path."""
    calls = []

    def counting(real_kernel):
        def call(*args, backend, **kwargs):
            calls.append(backend)
            return real_kernel(*args, backend=backend, **kwargs)
        return call

    # the triangle attentions call the gated form, the single-track attentions (Alg 24) the plain one
    monkeypatch.setattr(tab, "triangle_attention", counting(tab.triangle_attention))
    monkeypatch.setattr(tab, "gated_triangle_attention", counting(tab.gated_triangle_attention))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch = {k: v.to(device) for k, v in as_batch(read_tokens("1L2Y")).items()}
    torch.manual_seed(0)
    reference = perturb_zero_parameters(build_model(tiny_config(tri_attn_backend="torch"))).to(device)
    fused = build_model(tiny_config(tri_attn_backend="mini_of3", tri_mul_backend=tri_mul,
                                    pair_transition_backend="torch" if tri_mul == "auto" else "mini_of3")).to(device)
    fused.load_state_dict(reference.state_dict())
    results = []
    for model in (reference, fused):
        out = model(batch, n_recycles=1, generator=torch.Generator(device).manual_seed(3))
        loss, parts = compute_losses(out, batch, LossConfig())
        loss.backward()
        results.append((out, parts, {n: p.grad for n, p in model.named_parameters()}))
    (out_ref, parts_ref, grads_ref), (out_fused, parts_fused, grads_fused) = results
    half = len(calls) // 2             # torch model first, then the fused one; 2 recycles x 3 + 1 + 3 rollout steps
    assert set(calls[:half]) == {"torch"} and set(calls[half:]) == {"triton"} and half == 10
    for key in ("distogram_logits", "diffusion_coords", "plddt_logits", "plddt_coords"):
        assert relative_error(out_fused[key], out_ref[key]) < REL32, (key, relative_error(out_fused[key], out_ref[key]))
    for key in parts_ref:
        assert relative_error(parts_fused[key], parts_ref[key]) < REL32, key
    total = float(torch.cat([g.flatten() for g in grads_ref.values()]).norm())
    for name, g in grads_ref.items():       # relative to the whole gradient: some are zero up to rounding
        assert g is not None, name
        assert relative_error(grads_fused[name], g, total) < REL32, (name, relative_error(grads_fused[name], g, total))


@pytest.mark.parametrize("node", ["starting", "ending"])
def test_both_nodes_pass_one_projection_and_a_contiguous_bias_to_the_kernel(monkeypatch, node):
    """Our backends get q, k, v, g packed (one contiguous projection output); an anchor gets q, k, v as views of
    that output (row stride 4 H D), and the model gates around it; both compute the same update."""
    seen = []
    real_gated = tab.gated_triangle_attention

    def spy_gated(qkvg, bias, mask=None, **kwargs):
        seen.append({"qkvg": qkvg.shape, "contiguous": qkvg.is_contiguous(), "mask": mask.is_contiguous(),
                     "bias": bias.is_contiguous()})
        return real_gated(qkvg, bias, mask, **kwargs)

    def spy(q, k, v, bias, mask=None, **kwargs):
        seen.append({"qkv": [(t.stride(), t.untyped_storage().data_ptr()) for t in (q, k, v)],
                     "mask": mask.is_contiguous(), "bias": bias.is_contiguous()})
        return triangle_attention_ref(q, k, v, bias, mask, activation=kwargs.get("activation", "softmax"))

    monkeypatch.setattr(tab, "gated_triangle_attention", spy_gated)
    monkeypatch.setattr(tab, "triangle_attention", spy)
    B, N, H, D = 1, 6, 2, 16
    layer = TriangleAttention(c_z=8, n_heads=H, c_hidden=D, node=node, kernels=KernelChoice(tri_attn_backend="torch"))
    z, pair = torch.randn(B, N, N, 8, dtype=torch.float64), torch.ones(B, N, N, dtype=torch.bool)
    layer.double()
    gated = layer(z, pair)
    layer.attend_gated = None                 # as with an anchor: q, k, v views, the gate in PyTorch
    plain = layer(z, pair)
    packed, views = seen
    assert packed["qkvg"] == (B, N, N, 4, H, D) and packed["contiguous"] and packed["bias"] and packed["mask"]
    row = 4 * H * D                                               # q, k, v and the gate share one GEMM output
    assert all(stride == (N * N * row, N * row, row, D, 1) for stride, _ in views["qkv"])
    assert len({storage for _, storage in views["qkv"]}) == 1
    assert views["bias"] and views["mask"]
    assert relative_error(gated, plain) < 1e-12


def assert_layers_agree(reference, layer, z, pair) -> list[torch.Tensor]:
    """Two pair layers' updates and the gradients of z and of every parameter (under one fixed weighting of the
    update) agree to REL32; returns ``layer``'s."""
    results = []
    for module in (reference, layer):
        zi = z.clone().requires_grad_(True)
        out = module(zi, pair)
        (out * torch.linspace(-1, 1, out.numel(), device=z.device).view(out.shape)).sum().backward()
        results.append([out.detach(), zi.grad] + [p.grad for p in module.parameters()])
    for i, (got, ref) in enumerate(zip(results[1], results[0])):
        assert relative_error(got, ref) < REL32, (i, relative_error(got, ref))
    return results[1]


@pytest.mark.skipif(not triton_available, reason="needs CUDA or TRITON_INTERPRET=1 (set by tests/conftest.py)")
@pytest.mark.parametrize("direction", ["outgoing", "incoming"])
def test_tri_mul_on_mini_of3_kernel_equals_torch_path(direction):
    """TriangleMultiplication (AF3 SI Alg 12/13) with tri_mul_backend=mini_of3 against the torch path, float32, with
    padded tokens: the update and the gradients of z and of every parameter."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    layers = [TriangleMultiplication(c_z=16, c_hidden=16, direction=direction,
                                     kernels=KernelChoice(tri_mul_backend=b)).to(device) for b in ("torch", "mini_of3")]
    perturb_zero_parameters(layers[0])
    layers[1].load_state_dict(layers[0].state_dict())
    z = torch.randn(2, 11, 11, 16, device=device)
    token = torch.ones(2, 11, dtype=torch.bool, device=device)
    token[1, 8:] = False
    pair = token[:, :, None] & token[:, None, :]
    assert_layers_agree(*layers, z, pair)


@pytest.mark.skipif(not triton_available, reason="needs CUDA or TRITON_INTERPRET=1 (set by tests/conftest.py)")
@pytest.mark.parametrize("node,fused_gate", [("starting", True), ("ending", False)])
def test_tri_attn_on_mini_of3_kernel_equals_torch_path_with_padded_queries(node, fused_gate):
    """TriangleAttention (AF3 SI Alg 14/15) on our kernel (the gate inside it, or around it) against the torch path,
    float32, padded tokens masked as queries too (mask_queries, the model's default): the update, zero at every
    padded pair, and the gradients of z and of every parameter."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    layers = [TriangleAttention(c_z=8, n_heads=2, c_hidden=16, node=node,
                                kernels=KernelChoice(tri_attn_backend=b, tri_attn_fused_gate=fused_gate)).to(device)
              for b in ("torch", "mini_of3")]
    perturb_zero_parameters(layers[0])
    layers[1].load_state_dict(layers[0].state_dict())
    z = torch.randn(2, 11, 11, 8, device=device)
    token = torch.ones(2, 11, dtype=torch.bool, device=device)
    token[0, 7:] = False
    token[1, 4:] = False
    pair = token[:, :, None] & token[:, None, :]
    update, dz = assert_layers_agree(*layers, z, pair)[:2]
    assert torch.count_nonzero(update[~pair]) == 0 and torch.count_nonzero(dz[~pair]) == 0


def test_tri_mul_mini_of3_without_cuda_or_interpreter_names_the_fix(monkeypatch):
    """Like the mini_of3 attention backend: on CPU without TRITON_INTERPRET=1 the call raises a ValueError."""
    import sys
    monkeypatch.setattr(sys.modules["mini_of3.kernels.host"], "interpreting", lambda: False)
    layer = TriangleMultiplication(c_z=16, c_hidden=16, direction="outgoing",
                                   kernels=KernelChoice(tri_mul_backend="mini_of3"))
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        layer(torch.randn(1, 4, 4, 16), torch.ones(1, 4, 4, dtype=torch.bool))


def test_auto_is_the_torch_reference_on_cpu():
    q, k, v = (torch.randn(1, 5, 5, 2, 16) for _ in range(3))
    bias, mask = torch.randn(1, 2, 5, 5), torch.rand(1, 5, 5) > 0.2
    expected = triangle_attention_ref(q, k, v, bias, mask)
    assert torch.equal(tri_attn_backend(KernelChoice())(q, k, v, bias, mask), expected)
    assert torch.equal(tri_attn_backend(KernelChoice(tri_attn_backend="torch"))(q, k, v, bias, mask), expected)


@pytest.mark.parametrize("device_is_cuda", [False, True])
@pytest.mark.parametrize("op", ["tri_attn", "tri_attn_gated", "pair_bias", "tri_mul", "pair_transition"])
def test_auto_means_our_kernel_where_it_runs_for_every_op(monkeypatch, op, device_is_cuda):
    """model.*_backend = auto: our Triton kernel for CUDA tensors it takes, PyTorch on the CPU; the same rule for
    every op (the device is faked: the choice only, each kernel replaced by a spy)."""
    import mini_of3.model.transition as tr
    calls = []

    def spy(kernel_module, name):
        monkeypatch.setattr(kernel_module, name, lambda *a, **kw: calls.append(kw["backend"]) or a[0])

    layer, args = None, None
    if op in ("tri_attn", "tri_attn_gated", "pair_bias"):
        spy(tab, "gated_triangle_attention" if op == "tri_attn_gated" else "triangle_attention")
        kernels = KernelChoice(tri_attn_fused_gate=op == "tri_attn_gated")
        attend = tab.pair_bias_attention(kernels) if op == "pair_bias" else \
            (tab.tri_attn_backend_gated(kernels) if op == "tri_attn_gated" else tab.tri_attn_backend(kernels))
        x = torch.randn(1, 3, 3, 4, 2, 16) if op == "tri_attn_gated" else torch.randn(1, 3, 3, 2, 16)
        args = (x, None, None) if op == "tri_attn_gated" else (x, x, x, None, None)
        layer = attend
    elif op == "tri_mul":
        spy(tmb, "triangle_multiplication")
        monkeypatch.setattr(tmb, "triangle_multiplication_torch", lambda *a, **kw: calls.append("torch"))
        module = TriangleMultiplication(c_z=16, c_hidden=16, direction="outgoing")
        layer, args = module, (torch.randn(1, 3, 3, 16), torch.ones(1, 3, 3, dtype=torch.bool))
    else:
        spy(tr, "transition")
        layer, args = tr.Transition(c=16, n=2, kernels=KernelChoice()), (torch.randn(1, 3, 16),)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: device_is_cuda))
    layer(*args)
    if op == "pair_transition" and not device_is_cuda:
        assert calls == []                        # its own PyTorch code, no kernel call at all
    else:
        assert calls == ["triton" if device_is_cuda else "torch"]


# ---- anchors: layout and mask mapping, checked with stand-ins that follow each anchor's documented convention ----

def fake_trifast(q, k, v, bias, mask):        # q [B, H, I, J, D], bias [B, H, J, K] in q's dtype, mask True = out
    assert bias.dtype == q.dtype and mask.dtype == torch.bool
    o = triangle_attention_ref(*(x.permute(0, 2, 3, 1, 4) for x in (q, k, v)), bias, ~mask)
    return o.permute(0, 3, 1, 2, 4)


def fake_cueq(q, k, v, bias, mask=None):      # q [B, I, H, J, D], bias [B, 1, H, J, K] fp32, mask [B, I, 1, 1, K]
    assert bias.dtype == torch.float32 and mask.shape[2:4] == (1, 1)
    o = triangle_attention_ref(*(x.permute(0, 1, 3, 2, 4) for x in (q, k, v)), bias[:, 0], mask[:, :, 0, 0])
    return o.permute(0, 1, 3, 2, 4)


def fake_of3(q, k, v, additive_mask, bias):  # q [B, I, J, H, D] (openfold3 0.5, evoformer.py: "[Batch, N_seq, N_res,
    # Head, Dim]"), additive mask [B, I, 1, 1, K], bias [B, 1, H, J, K]
    scores = torch.einsum("bijhd,bikhd->bihjk", q, k) / math.sqrt(q.shape[-1]) + bias + additive_mask
    return torch.einsum("bihjk,bikhd->bijhd", torch.softmax(scores, -1), v)


@pytest.mark.parametrize("name,fake", [("trifast", fake_trifast), ("cueq", fake_cueq), ("of3_triton", fake_of3)])
def test_anchor_adapters_map_layouts_and_masks(monkeypatch, name, fake):
    """Every pair, padded ones included: the anchors compute every query and the adapter zeroes the padded ones'
    outputs (mask_queries), as our backends give them."""
    monkeypatch.setattr(tab, "import_anchor", lambda *args: fake)
    torch.manual_seed(0)
    for node in ("starting", "ending"):
        ref = TriangleAttention(c_z=8, n_heads=2, c_hidden=16, node=node,
                                kernels=KernelChoice(tri_attn_backend="torch"))
        anchor = TriangleAttention(c_z=8, n_heads=2, c_hidden=16, node=node,
                                   kernels=KernelChoice(tri_attn_backend=name))
        anchor.load_state_dict(ref.state_dict())
        z = torch.randn(2, 6, 6, 8)
        token = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
        pair = token[:, :, None] & token[:, None, :]
        update = anchor(z, pair)
        assert relative_error(update, ref(z, pair)) < REL32, node
        assert torch.count_nonzero(update[~pair]) == 0, node


@pytest.mark.parametrize("name,package", [("trifast", "trifast"), ("cueq", "cuequivariance_torch"),
                                          ("of3_triton", "openfold3")])
def test_missing_anchor_raises_naming_the_package(name, package):
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    with pytest.raises(ImportError, match=package):
        build_model(tiny_config(tri_attn_backend=name))


def test_backend_argument_errors():
    """One line naming the key, the value and what is expected, as the config's own message for a bad value."""
    expected = "model.tri_mul_backend: got 'fused', expected one of auto, mini_of3, torch, cueq"
    with pytest.raises(ValueError, match=expected):
        KernelChoice(tri_mul_backend="fused")
    with pytest.raises(ValueError, match="model.tri_attn_backend: got 'flash', expected one of auto, mini_of3"):
        KernelChoice(tri_attn_backend="flash")
    with pytest.raises(ValueError, match="model.pair_transition_backend: got 'cueq', expected one of auto"):
        KernelChoice(pair_transition_backend="cueq")
    with pytest.raises(ValueError, match="'trifast' implements softmax attention only"):
        KernelChoice(tri_attn_backend="trifast", tri_attn_activation="sigmoid")
    with pytest.raises(ValueError, match="model.tri_attn_split_ds: got 'yes', expected true or false"):
        KernelChoice(tri_attn_split_ds="yes")
    with pytest.raises(ValueError, match=r"tri_attn_backend\s+Input should be 'auto', 'mini_of3'"):
        tiny_config(tri_attn_backend="flash")                   # the model config section checks it when made
    if importlib.util.find_spec("cuequivariance_torch") is None:
        with pytest.raises(ImportError, match="cuequivariance_torch"):
            build_model(tiny_config(tri_mul_backend="cueq"))
    with pytest.raises(ConfigError, match=expected):
        load_config(None, ["model.tri_mul_backend=fused"])
    assert load_config(None, ["model.tri_mul_backend=mini_of3"]).model.tri_mul_backend == "mini_of3"


def test_the_choice_takes_the_config_keys_by_name():
    """KernelChoice's fields are the model config's keys, with the same defaults; the model builds it once and every
    layer holds that one object."""
    import dataclasses
    fields = {f.name: f.default for f in dataclasses.fields(KernelChoice)}
    assert {name: getattr(ModelConfig(), name) for name in fields} == fields
    cfg = tiny_config(tri_attn_backend="torch", tri_mul_backend="mini_of3", tri_attn_split_ds=True)
    assert KernelChoice.from_config(cfg) == KernelChoice(tri_attn_backend="torch", tri_mul_backend="mini_of3",
                                                         tri_attn_split_ds=True, pair_transition_backend="auto")


def test_the_names_import_without_torch():
    """config.py takes the allowed values from mini_of3.model.kernel_choice: importing it loads no torch."""
    import subprocess
    import sys
    code = "import sys, mini_of3.model.kernel_choice; assert 'torch' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- anchors through the real packages (GPU only; skipped where the package does not import) ----

def _anchor_imports(name: str) -> bool:
    try:
        tab.import_anchor(name, *tab._ANCHOR_PACKAGES[name])
        return True
    except ImportError:
        return False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the anchors are CUDA kernels")
@pytest.mark.parametrize("name", ["trifast", "cueq", "of3_triton"])
def test_real_anchor_packages_match_the_torch_path(name):
    """The same layer (starting and ending node, padded tokens, N = 70 not a tile multiple) through the installed
    anchor package equals the torch path in bf16: outputs and the gradients of z and every parameter."""
    if not _anchor_imports(name):
        pytest.skip(f"{name} does not import here")
    torch.manual_seed(0)
    B, N, C = 2, 70, 32
    token = torch.ones(B, N, dtype=torch.bool, device="cuda")
    token[1, 57:] = False
    pair = token[:, :, None] & token[:, None, :]
    real = pair[..., None].expand(B, N, N, C)
    for node in ("starting", "ending"):
        ref = TriangleAttention(c_z=C, n_heads=4, c_hidden=32, node=node,
                                kernels=KernelChoice(tri_attn_backend="torch")).cuda()
        anchor = TriangleAttention(c_z=C, n_heads=4, c_hidden=32, node=node,
                                   kernels=KernelChoice(tri_attn_backend=name)).cuda()
        anchor.load_state_dict(ref.state_dict())
        z = torch.randn(B, N, N, C, device="cuda")
        outs, grads = [], []
        for layer in (ref, anchor):
            zi = z.clone().requires_grad_()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = layer(zi, pair)
            (out.float()[real] * torch.linspace(-1, 1, int(real.sum()), device="cuda")).sum().backward()
            outs.append(out.float()[real])
            grads.append([zi.grad[real]] + [p.grad for p in layer.parameters()])
        torch.testing.assert_close(outs[1], outs[0], rtol=2e-2, atol=2e-2, msg=f"{name} {node} output")
        for i, (g_anchor, g_ref) in enumerate(zip(grads[1], grads[0])):
            err = (g_anchor.float() - g_ref.float()).norm() / g_ref.float().norm()
            assert err < 3e-2, f"{name} {node} gradient {i}: relative error {err:.2e}"


@pytest.mark.parametrize("backend,fused", [("torch", True), ("torch", False), ("trifast", True)])
def test_fused_gate_follows_the_config(monkeypatch, backend, fused):
    """model.tri_attn_fused_gate: our backends gate inside the kernels unless it is false; an anchor never does."""
    monkeypatch.setattr(tab, "import_anchor", lambda *args: (lambda *a: None))
    model = build_model(tiny_config(tri_attn_backend=backend, tri_attn_fused_gate=fused))
    layers = [m for m in model.modules() if isinstance(m, TriangleAttention)]
    assert layers and all((m.attend_gated is not None) == (fused and backend == "torch") for m in layers)


@pytest.mark.parametrize("split_ds", [True, False])
def test_split_ds_follows_the_config(monkeypatch, split_ds):
    """model.tri_attn_split_ds reaches our kernel's call in both triangle attention layers of every block."""
    seen = []
    monkeypatch.setattr(tab, "gated_triangle_attention", lambda *args, **kwargs: seen.append(kwargs["split_ds"]))
    model = build_model(tiny_config(tri_attn_backend="torch", tri_attn_split_ds=split_ds))
    layers = [m for m in model.modules() if isinstance(m, TriangleAttention)]
    for layer in layers:
        layer.attend_gated(torch.zeros(1, 2, 2, 4, 1, 16), None, None)
    assert len(layers) >= 2 and seen == [split_ds] * len(layers)


@pytest.mark.parametrize("backend,c,device_is_cuda,uses_kernel", [
    ("torch", 16, True, False), ("mini_of3", 16, False, True), ("auto", 16, False, False), ("auto", 16, True, True),
    ("auto", 384, True, False), ("auto", 24, True, False), ("auto", 16, True, "float64")])
def test_transition_backend_choice(monkeypatch, backend, c, device_is_cuda, uses_kernel):
    """model.pair_transition_backend: auto takes our kernel on CUDA where it fits the widths (c <= 256, multiples of
    16), else PyTorch; mini_of3 always takes it; torch never. (The device is faked: the choice only.)"""
    import mini_of3.model.transition as tr
    calls = []
    monkeypatch.setattr(tr, "transition", lambda x, **kwargs: calls.append(kwargs["backend"]) or x)
    layer = tr.Transition(c=c, n=2, kernels=KernelChoice(pair_transition_backend=backend))
    x = torch.randn(1, 3, c)
    if uses_kernel == "float64":       # a float64 model stays on PyTorch
        layer, x, uses_kernel = layer.double(), x.double(), False
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: device_is_cuda))
    layer(x)
    assert calls == (["triton"] if uses_kernel else [])


def test_the_pair_transitions_take_the_backend_the_single_track_runs_pytorch():
    """model.pair_transition_backend reaches every pair transition: the Pairformer's (n = 4) and the diffusion
    conditioning's two (n = 2, AF3 SI Alg 21); the single track's and the heads' run their PyTorch code."""
    model = build_model(tiny_config(pair_transition_backend="mini_of3"))
    from mini_of3.model.transition import Transition
    backends = {name: m.backend for name, m in model.named_modules() if isinstance(m, Transition)}
    pair = {name for name in backends if name.endswith("pair_transition") or ".pair_transitions." in name}
    assert {name for name in pair if "conditioning" in name} == {"diffusion.conditioning.pair_transitions.0",
                                                                  "diffusion.conditioning.pair_transitions.1"}
    assert all(backends[name] == "mini_of3" for name in pair)
    assert len(backends) > len(pair) and all(b == "torch" for name, b in backends.items() if name not in pair)


@pytest.mark.parametrize("head_dim,kernel", [(24, "triton"), (16, "triton"), (160, "torch")])
def test_the_single_attention_runs_our_kernel_at_head_dim_24(monkeypatch, head_dim, kernel):
    """AF3's single attention (c_s 384, 16 heads: head dim 24) takes our kernel on CUDA, zero-padded to 32 inside
    the op; only a head dim above 128 falls back to PyTorch (the device is faked: the choice only)."""
    calls = []
    monkeypatch.setattr(tab, "triangle_attention", lambda *a, **kw: calls.append(kw["backend"]) or a[0])
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    x = torch.randn(1, 1, 3, 2, head_dim)
    tab.pair_bias_attention(KernelChoice())(x, x, x, None, None)
    assert calls == [kernel]
