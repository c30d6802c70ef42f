"""The Pairformer block under torch.compile: no graph break inside it, and the same outputs and gradients as eager
(CPU, inductor). Our triangle attention is a custom op, opaque to the compiler: checked with the Triton kernel under
the interpreter as well as with the PyTorch reference."""
import pytest
import torch
import torch._dynamo

from mini_of3.model import build_model
from mini_of3.model.compiled import compile_blocks, run_block, run_sampler_step, uncompile_blocks
from mini_of3.model.kernel_choice import KernelChoice
from mini_of3.model.pairformer import PairformerBlock
from mini_of3.model.sampler import sample_diffusion
from tiny import perturb_zero_parameters, random_batch, relative_error, tiny_config

REL32 = 2 ** 7 * torch.finfo(torch.float32).eps     # two float32 evaluations summing in different orders


def block_and_inputs(backend: str, tri_mul_backend: str = "auto"):
    """A tiny block and its inputs; with tri_mul_backend = mini_of3 the pair transition runs on our kernel too."""
    torch.manual_seed(0)
    kernels = KernelChoice(tri_attn_backend=backend, tri_mul_backend=tri_mul_backend,
                           pair_transition_backend="mini_of3" if tri_mul_backend == "mini_of3" else "auto")
    block = PairformerBlock(c_s=32, c_z=16, n_heads_tri=2, c_hidden_tri=16, n_heads_single=2, c_hidden_mul=16,
                            transition_factor=2, pair_dropout=0.0, kernels=kernels)
    perturb_zero_parameters(block)
    s, z = torch.randn(1, 11, 32), torch.randn(1, 11, 11, 16)
    mask = torch.ones(1, 11, dtype=torch.bool)
    mask[:, -3:] = False
    return block, s, z, mask


@pytest.mark.parametrize("backend,tri_mul_backend", [("torch", "auto"), ("mini_of3", "auto"),
                                                     ("mini_of3", "mini_of3")])
def test_the_block_compiles_to_one_graph_without_breaks(backend, tri_mul_backend):
    block, s, z, mask = block_and_inputs(backend, tri_mul_backend)
    explained = torch._dynamo.explain(run_block)(block, s, z, mask)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


def test_block_on_both_kernels_compiled_fullgraph_matches_eager():
    """The block with our triangle attention, triangle multiplication and transition kernels (custom ops, the Triton
    interpreter on CPU) under torch.compile(fullgraph=True), bf16 autocast: outputs and every parameter gradient as
    eager. The aot_eager backend traces forward and backward as inductor does, without its minute of CPU code
    generation; the kernels then see the same inputs, and the rest runs the same ATen ops, so the results agree
    bitwise."""
    block, s, z, mask = block_and_inputs("mini_of3", "mini_of3")
    results = []
    for fn in (run_block, torch.compile(run_block, backend="aot_eager", fullgraph=True)):
        block.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            s_out, z_out = fn(block, s, z, mask)
        (s_out.float().square().sum() + z_out.float().square().sum()).backward()
        results.append((s_out.detach(), z_out.detach(), {n: p.grad.clone() for n, p in block.named_parameters()}))
    torch._dynamo.reset()
    (s0, z0, g0), (s1, z1, g1) = results
    assert torch.equal(s1, s0) and torch.equal(z1, z0)
    for name, g in g0.items():
        assert torch.equal(g1[name], g), name


@pytest.mark.slow
def test_compiled_block_matches_eager_outputs_and_gradients():
    """Inductor on the CPU compiles for about a minute: python -m pytest -m slow tests/model/test_compiled.py"""
    block, s, z, mask = block_and_inputs("torch")
    results = []
    for fn in (run_block, torch.compile(run_block)):
        block.zero_grad(set_to_none=True)
        s_out, z_out = fn(block, s, z, mask)
        (s_out.square().sum() + z_out.square().sum()).backward()
        results.append((s_out.detach(), z_out.detach(), {n: p.grad.clone() for n, p in block.named_parameters()}))
    torch._dynamo.reset()
    (s0, z0, g0), (s1, z1, g1) = results
    assert relative_error(s1, s0) < REL32 and relative_error(z1, z0) < REL32
    total = torch.sqrt(sum(g.double().square().sum() for g in g0.values()))
    for name, g in g0.items():
        assert relative_error(g1[name], g, total) < REL32, name


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compile_blocks_sets_and_uncompile_restores_every_stack(mode, monkeypatch):
    """Both compiled functions (blocks, sampler step) get trainer.compile_mode; uncompile_blocks restores eager."""
    modes = []
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: modes.append(kw.get("mode")) or real_compile(fn, **kw))
    model = build_model(tiny_config())
    stacks = compile_blocks(model, mode)
    assert modes == [mode, mode]
    assert {type(s).__name__ for s in stacks} == {"PairformerStack", "DiffusionModule"}
    assert all(s.run_block is not run_block for s in stacks)
    assert model.diffusion.run_sampler_step is not run_sampler_step
    uncompile_blocks(model)
    assert all(s.run_block is run_block for s in stacks)
    assert model.diffusion.run_sampler_step is run_sampler_step


def test_cuda_graphs_with_activation_checkpointing_warn_and_compile_in_the_default_mode(monkeypatch):
    """reduce-overhead on checkpointed stacks (CUDA graph trees cannot replay a recomputed block) falls back to the
    default mode with one warning (the blocks; the sampler step, never checkpointed, keeps it); without
    checkpointing the mode is kept."""
    modes = []
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: modes.append(kw.get("mode")) or real_compile(fn, **kw))
    with pytest.warns(UserWarning, match="model.checkpointing=false"):
        compile_blocks(build_model(tiny_config(checkpointing=True)), "reduce-overhead")
    assert modes == ["default", "reduce-overhead"]
    modes.clear()
    compile_blocks(build_model(tiny_config(checkpointing=False)), "reduce-overhead")
    assert modes == ["reduce-overhead", "reduce-overhead"]


@pytest.mark.parametrize("backend", ["torch", "mini_of3"])
def test_a_sampler_step_compiles_to_one_graph_and_samples_as_eager(backend):
    """The pLDDT rollout's sampler step (augmentation, the denoiser with its transformer blocks, the update) is one
    graph with no break, and sampling through it (aot_eager: the same ATen ops, and our attention kernel as an
    opaque custom op, under the interpreter for ``mini_of3``) gives the eager samples bitwise, for two samples of
    a padded batch over five steps (one graph for all of them: the per-step numbers are tensors)."""
    import functools
    torch.manual_seed(0)
    model = build_model(tiny_config(tri_attn_backend=backend, diffusion_blocks=2))
    perturb_zero_parameters(model)
    model.eval()
    batch = random_batch(1, 13, seed=3)
    batch["token_mask"][:, -2:] = False
    with torch.no_grad():
        s_inputs, s, z = model.trunk(batch, 0)
        context = model.diffusion.prepare(batch, s_inputs, s, z)
        mask = batch["token_mask"]
        samples = []
        for step_fn in (run_sampler_step, torch.compile(run_sampler_step, backend="aot_eager", fullgraph=True)):
            torch._dynamo.reset()
            object.__setattr__(model.diffusion, "run_sampler_step", step_fn)
            samples.append(sample_diffusion(None, (1, 2, 13, 3), mask, sigma_data=16.0, steps=5,
                                            generator=torch.Generator().manual_seed(5),
                                            sampler_step=functools.partial(model.diffusion.sampler_step, context)))
        object.__setattr__(model.diffusion, "run_sampler_step", run_sampler_step)
        inputs = (samples[0], mask, torch.randn(1, 2, 4, dtype=torch.float64), torch.randn(1, 2, 1, 3),
                  torch.randn(1, 2, 13, 3), torch.full((1, 2), 3.0), torch.tensor(-1.0))
        explained = torch._dynamo.explain(run_sampler_step)(model.diffusion, context, *inputs)
    torch._dynamo.reset()
    assert torch.equal(samples[1], samples[0])
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
def test_cuda_graph_mode_trains_and_samples_as_the_default_mode():
    """trainer.compile_mode=reduce-overhead (the compiled blocks and sampler step replayed as CUDA graphs, our
    kernels inside them) against the default mode: three training steps (losses and every gradient of the last) and
    a sampling run after them repeat bitwise, since a replay runs the recorded kernels on the same inputs."""
    from mini_of3.losses import compute_losses
    from mini_of3.config import LossConfig

    batch = {k: v.cuda() for k, v in random_batch(1, 48, seed=4).items()}
    batch["token_mask"][:, -5:] = False
    results = {}
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = build_model(tiny_config(tri_attn_backend="mini_of3", tri_mul_backend="mini_of3", c_z=32,
                                        c_hidden_mul=32, diffusion_samples=4)).cuda()
        perturb_zero_parameters(model)
        compile_blocks(model, mode)
        losses = []
        for step in range(3):
            model.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(batch, n_recycles=0, generator=torch.Generator("cuda").manual_seed(step))
            loss = compute_losses(out, batch, LossConfig())[0]
            loss.backward()
            losses.append(loss.detach().clone())
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.eval()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            sample = model.sample(batch, n_recycles=0, steps=6, samples=2,
                                  generator=torch.Generator("cuda").manual_seed(9))["coords"].clone()
        results[mode] = (losses, grads, sample)
    torch._dynamo.reset()
    (l0, g0, x0), (l1, g1, x1) = results["default"], results["reduce-overhead"]
    assert all(torch.equal(a, b) for a, b in zip(l0, l1)), (l0, l1)
    assert g0.keys() == g1.keys() and all(torch.equal(g0[n], g1[n]) for n in g0)
    assert torch.equal(x0, x1)


def test_the_sampler_step_runs_as_a_cuda_graph_on_cuda_in_the_default_mode_too():
    from mini_of3.model.compiled import sampler_compile_mode
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert sampler_compile_mode("default", cuda) == sampler_compile_mode("reduce-overhead", cuda) == "reduce-overhead"
    assert sampler_compile_mode("default", cpu) == "default"
    assert sampler_compile_mode("max-autotune-no-cudagraphs", cuda) == "max-autotune-no-cudagraphs"
