"""``python -m mini_of3.bench step [CONFIG]``: the real training step with the triangle backends swapped, one process.

Every arm (``<tri_attn_backend>+<tri_mul_backend>``) gets the same initial weights (one model built from the config's
seed, its state copied into each arm) and, per crop, the same real crop: the largest entry of the prepared folder,
cropped by the data pipeline. A step is the trainer's: forward under bf16 autocast (``n_recycles = 0``), the losses,
backward, AdamW. The arms are interleaved over rounds (the order rotated each round) so that clock drift hits all
alike; each row reports the median step time and the spread over rounds, peak memory above the weights and optimizer
state, the first step's loss (the same weights and noise for every arm: it must agree within bf16 rounding), and
where one profiled step spent its GPU time (:func:`breakdown`).

    python -m mini_of3.bench step configs/crop768.yaml --crops 640,768 --arms mini_of3+cueq,cueq+cueq
    python -m mini_of3.bench step --crops 256,512 --arms mini_of3+cueq:reduce-overhead model.checkpointing=false
    python -m mini_of3.bench step --arms mini_of3+mini_of3,mini_of3+mini_of3:reduce-overhead   (a compile mode per arm)
    python -m mini_of3.bench step configs/crop768.yaml --crops 320,768 --entry 6W13 --pad   (what padding costs)
"""
from __future__ import annotations

import argparse
import copy
import re
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from mini_of3.bench.common import (load_bench_config, package_versions, peak_mib, print_table, result_header,
                                   write_json)
from mini_of3.config import ConfigError, load_config
from mini_of3.losses import compute_losses
from mini_of3.model import build_model
from mini_of3.model.compiled import compile_blocks, sampler_compile_mode
from mini_of3.model.kernel_choice import TRI_ATTN_BACKENDS, TRI_MUL_BACKENDS
from mini_of3.training.optim import build_optimizer

DEFAULT_CONFIG = "configs/crop768.yaml"   # the crop configs' model; checkpointing and the default compile mode
                                         # at every crop (crop256-512.yaml turn both off for CUDA graphs: an arm's
                                         # ":reduce-overhead" with model.checkpointing=false)
DEFAULT_ARMS = "mini_of3+mini_of3,mini_of3+cueq,cueq+cueq,trifast+cueq,of3_triton+cueq,cueq+mini_of3,mini_of3+torch"
COMPILE_MODES = ("default", "reduce-overhead")      # an arm's optional ``:mode`` (trainer.compile_mode)
SLOW_STEP_S = 10.0        # an arm whose warm-up step takes longer is not timed at this crop or any larger one
CATEGORIES = ("triangle attention", "triangle multiplication", "pair transition", "GEMMs", "layer norms",
              "copies/casts", "diffusion module (fwd)", "pLDDT rollout", "optimizer", "other")


# ---------------------------------------------------------------------------------------------------------------
# arguments


def split_arm(arm: str) -> tuple[str, str, str | None]:
    """``attn+mul[:mode][@model_key=value...]`` -> (attn, mul, mode or None); see :func:`arm_model_overrides`."""
    backends, _, mode = arm.split("@")[0].partition(":")
    attn, _, mul = backends.partition("+")
    return attn, mul, mode or None


def arm_model_overrides(arm: str) -> list[str]:
    """The arm's own ``model.*`` overrides: ``mini_of3+cueq@tri_attn_fused_gate=false`` ->
    ["model.tri_attn_fused_gate=false"] (an ablation measured beside the other arms, in the same process)."""
    return [f"model.{item}" for item in arm.split("@")[1:]]


def parse_arms(text: str, cfg=None) -> list[str]:
    """``attn+mul[:mode][@model_key=value...],...`` -> the arm names, or one clear error line (the overrides are
    checked against ``cfg`` when given)."""
    arms = [a for a in text.split(",") if a]
    for arm in arms:
        attn, mul, mode = split_arm(arm)
        if attn not in TRI_ATTN_BACKENDS or mul not in TRI_MUL_BACKENDS or mode not in (None, *COMPILE_MODES):
            raise SystemExit(f"--arms: {arm!r} is not <tri_attn_backend>+<tri_mul_backend>[:compile mode]"
                             f"[@model_key=value...] with tri_attn_backend in {TRI_ATTN_BACKENDS}, tri_mul_backend in "
                             f"{TRI_MUL_BACKENDS} and the mode in {COMPILE_MODES}")
        if cfg is not None and arm_model_overrides(arm):
            try:
                arm_model(cfg.model, arm)
            except (ConfigError, ValueError) as err:
                raise SystemExit(f"--arms: {arm!r}: {err}") from None
    if not arms:
        raise SystemExit("--arms: no arm given")
    return arms


def arm_model(model_cfg, arm: str):
    """The model config of an arm: its backends and its own overrides applied to ``model_cfg``."""
    attn, mul, _ = split_arm(arm)
    cfg = load_config(overrides=arm_model_overrides(arm))     # defaults + the arm's keys, parsed and checked
    changed = {key.split("=")[0].removeprefix("model.").strip() for key in arm_model_overrides(arm)}
    return replace(model_cfg, tri_attn_backend=attn, tri_mul_backend=mul,
                   **{key: getattr(cfg.model, key) for key in changed})


def parse_crops(text: str) -> list[int]:
    try:
        crops = [int(c) for c in text.split(",") if c]
    except ValueError:
        raise SystemExit(f"--crops: expected comma-separated token counts, got {text!r}") from None
    if not crops or min(crops) < 8:
        raise SystemExit(f"--crops: expected crop sizes of at least 8 tokens, got {text!r}")
    return list(dict.fromkeys(crops))     # in the order given: a time limit may cut the last ones


# ---------------------------------------------------------------------------------------------------------------
# inputs


def real_crop(prepared: Path, crop: int, device: torch.device, entry: str | None = None, pad: bool = False
              ) -> tuple[dict, str]:
    """A crop of ``crop`` tokens (fewer if the entry is smaller) of ``entry`` (default: the entry with the most
    resolved tokens), as the training loader makes it (cropper drawn from seed 0), padded to ``crop`` tokens when
    ``pad`` (as ``data.pad_to_crop`` does), on ``device``; and the entry's id."""
    from mini_of3.config import DataConfig
    from mini_of3.data.dataset import ProteinDataset, collate, is_named
    from mini_of3.data.prepare import read_manifest

    rows = read_manifest(prepared)
    if not rows:
        raise SystemExit(f"{prepared}: no prepared entries (run python -m mini_of3.data.prepare first)")
    if entry is None:
        chosen = max(rows, key=lambda r: r.resolved_tokens)
    else:
        named = [r for r in rows if is_named(r, [entry])]
        if not named:
            raise SystemExit(f"--entry {entry}: not in {prepared} (its entries: "
                             f"{', '.join(sorted(r.id for r in rows)[:12])}{', ...' if len(rows) > 12 else ''})")
        chosen = named[0]
    dataset = ProteinDataset(prepared, DataConfig(crop_size=crop, min_tokens=1, max_resolution=None), "all",
                             seed=0, rows=[chosen])
    batch = collate([dataset[0]], n_tokens=crop if pad else None)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}, chosen.id


class Arm:
    """One backend pair: its model (the shared initial weights) and optimizer, and a training step."""

    def __init__(self, name: str, cfg, state: dict, device: torch.device) -> None:
        attn, mul, mode = split_arm(name)
        self.name, self.cfg, self.device = name, cfg, device
        self.cuda_graphs = (mode or (cfg.trainer.compile_mode if cfg.trainer.compile else None)) == "reduce-overhead"
        self.model = build_model(arm_model(cfg.model, name)).to(device)
        self.model.load_state_dict(state)
        compiled = cfg.trainer.compile or mode is not None
        if compiled:   # the blocks compiled, as in training (the arm's mode, else the config's)
            compile_blocks(self.model, mode or cfg.trainer.compile_mode)
        # CUDA graphs in this arm: the blocks' (reduce-overhead) or the sampler step's (sampler_compile_mode)
        self.graphed = self.cuda_graphs or (
            compiled and sampler_compile_mode(mode or cfg.trainer.compile_mode, device) == "reduce-overhead")
        self.optimizer, _ = build_optimizer(self.model, cfg.optim)
        self.slow_from: int | None = None          # the first crop at which a step took longer than SLOW_STEP_S

    def step(self, batch: dict) -> float:
        """One training step (same dropout masks and diffusion noise for every arm); returns the loss."""
        cuda = self.device.type == "cuda"
        if self.graphed:
            # each step a new generation of the CUDA graph trees: interleaved arms otherwise leave another arm's
            # memory behind each step, and the graphs re-record (5-11 s steps at 256-512, step_ro2/ro3; 3-10 s
            # rounds of the default mode's graphed sampler step, step_g2)
            torch.compiler.cudagraph_mark_step_begin()
        self.model.train()
        torch.manual_seed(self.cfg.seed)
        generator = torch.Generator(self.device).manual_seed(self.cfg.seed)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cuda), \
                torch.profiler.record_function("bench::forward"):
            out = self.model(batch, n_recycles=0, generator=generator)
        with torch.profiler.record_function("bench::losses"):
            loss, _ = compute_losses(out, batch, self.cfg.loss)
        with torch.profiler.record_function("bench::backward"):
            loss.backward()
        with torch.profiler.record_function("optimizer"):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()

    def release(self) -> None:
        """Give the optimizer's state back (AdamW keeps two tensors per weight) between crops."""
        self.optimizer.state.clear()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_step(arm: Arm, batch: dict) -> tuple[float, float]:
    """(seconds, loss) of one step, the device synchronised on both sides."""
    synchronize(arm.device)
    start = time.perf_counter()
    loss = arm.step(batch)
    synchronize(arm.device)
    return time.perf_counter() - start, loss


# ---------------------------------------------------------------------------------------------------------------
# where the GPU time goes


_BY_NAME = (   # (category, pattern on a kernel's or op's name), first match wins
    ("pair transition", r"_transition_(fwd|bwd)\b"),          # our fused transition (before the attention's _fwd)
    ("triangle multiplication", r"triangle_mul|trimul|tri_mul|multiplicative|fused_sigmoid_gated_dual_gemm|"
                                r"layer_norm_transpose"),      # ours (_tri_mul_*) and cuEquivariance's kernels
    ("triangle attention", r"_fwd\b|_bwd_dq|_bwd_dkdv|_bwd_dbias|_bwd_kv|_bwd_q\b|_bwd_b\b|_sum_chunks|attention|attn|"
                           r"evoformer|fmha|sdpa"),
    ("GEMMs", r"gemm|cutlass|xmma|nvjet|wgmma|cublas|aten::mm\b|aten::bmm|aten::addmm|aten::matmul|aten::linear"),
    ("layer norms", r"layer_norm|layernorm|LayerNorm"),
    ("copies/casts", r"copy|[Cc]ast|convert|CatArray|aten::to\b|aten::_to_copy|aten::cat|aten::contiguous|"
                     r"aten::clone|transpose"),
)
_SCOPES = {"optimizer": "optimizer", "bench::plddt_rollout": "pLDDT rollout",
           "bench::diffusion_module": "diffusion module (fwd)", "bench::triangle_attention": "triangle attention",
           "bench::triangle_multiplication": "triangle multiplication"}


def categorize(name: str, scopes: list[str]) -> str:
    """The category of one kernel (or, on the CPU, one op) from the names of its enclosing ranges (innermost
    first) and its own name: the optimizer, pLDDT rollout and the diffusion module's forward by range; then by
    name; then a kernel in a triangle layer's range counts for that layer."""
    for scope in scopes:
        if _SCOPES.get(scope) in ("optimizer", "pLDDT rollout", "diffusion module (fwd)"):
            return _SCOPES[scope]
    for category, pattern in _BY_NAME:
        if re.search(pattern, name):
            return category
    for scope in scopes:
        if scope in _SCOPES:
            return _SCOPES[scope]
        if re.search(r"TriangleAttention|triangle_attention", scope):
            return "triangle attention"
        if re.search(r"TriangleMultiplic|triangle_multiplicative", scope):
            return "triangle multiplication"
    return "other"


def _scope_hooks(model: torch.nn.Module) -> list:
    """Forward hooks that open a profiler range around the modules the breakdown names (removed after profiling).
    The diffusion module without gradients is the pLDDT rollout's sampler; the pLDDT head belongs to it too."""
    from mini_of3.model.triangle import TriangleAttention, TriangleMultiplication

    def scope_of(module) -> str | None:
        if module is model.diffusion:
            return "bench::diffusion_module" if torch.is_grad_enabled() else "bench::plddt_rollout"
        if module is model.plddt_head:
            return "bench::plddt_rollout"
        if module is model.pairformer:
            return "bench::trunk"
        if isinstance(module, TriangleAttention):
            return "bench::triangle_attention"
        if isinstance(module, TriangleMultiplication):
            return "bench::triangle_multiplication"
        return None

    open_ranges: list = []

    def enter(module, args):
        scope = scope_of(module)
        if scope is not None:
            r = torch.profiler.record_function(scope)
            r.__enter__()
            open_ranges.append(r)

    def leave(module, args, output):
        if scope_of(module) is not None and open_ranges:
            open_ranges.pop().__exit__(None, None, None)

    modules = [model.pairformer, model.diffusion, model.plddt_head,
               *(m for m in model.modules() if isinstance(m, (TriangleAttention, TriangleMultiplication)))]
    return [h for m in modules for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]


def _timed_items(events, cuda: bool):
    """(name, microseconds, enclosing range names innermost first) per GPU kernel, or per CPU op (self time)."""
    for event in events:
        scopes, parent = [], event.cpu_parent
        while parent is not None:
            scopes.append(parent.name)
            parent = parent.cpu_parent
        if cuda:
            for kernel in event.kernels:
                yield kernel.name, kernel.duration, [event.name, *scopes]
        elif event.name.startswith("aten::") and event.self_cpu_time_total > 0:
            yield event.name, event.self_cpu_time_total, scopes


_BLOCKING_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                   "cudaMemcpyAsync", "cudaStreamWaitEvent")
_LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


PHASES = ("bench::forward", "bench::trunk", "bench::diffusion_module", "bench::plddt_rollout", "bench::losses",
          "bench::backward", "optimizer")     # the step's ranges that GPU idle time is attributed to (forward alone: the embedder,
                           # the distogram head, the diffusion module's preparation)


def gpu_idle_by_phase(kernels: list[tuple[int, int, int]], phases: list[tuple[int, int, str]]) -> dict[str, float]:
    """Milliseconds the GPU sat idle, by the phase of the step whose host code launched the work that ended the gap.

    kernels: (start_ns, end_ns, launch_ns) of every GPU activity (kernels, copies, memsets), launch_ns the host time
    of its launch call; phases: (start_ns, end_ns, name) host ranges, nested or not (the innermost that holds the
    launch counts). A gap the host fills late shows under the phase that was launching: a host-bound phase (many
    small launches, or a synchronisation before it) collects the idle time. The time from the first phase's start
    to the first activity counts too. Keys: the phase names (``-`` outside every phase), in ms.
    """
    idle: dict[str, float] = {}
    if not kernels:
        return idle
    kernels = sorted(kernels)
    busy_until = min([kernels[0][0], *(start for start, _, _ in phases)])
    for start, end, launch in kernels:
        if start > busy_until:
            name = _phase_at(launch, phases)
            idle[name] = idle.get(name, 0.0) + (start - busy_until) / 1e6
        busy_until = max(busy_until, end)
    return {name: round(ms, 3) for name, ms in sorted(idle.items(), key=lambda kv: -kv[1])}


def launches_by_phase(kernels: list[tuple[int, int, int]], phases: list[tuple[int, int, str]]) -> dict[str, int]:
    """How many GPU activities each phase launched (the innermost phase holding the launch; ``-`` outside every
    phase), most first: where the host's launches, and so its time in a host-bound step, go."""
    counts: dict[str, int] = {}
    for _, _, launch in kernels:
        name = _phase_at(launch, phases)
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _phase_at(t: int, phases: list[tuple[int, int, str]]) -> str:
    """The innermost phase holding host time ``t``, or ``-``."""
    holding = [(end - start, name) for start, end, name in phases if start <= t <= end]
    return min(holding)[1] if holding else "-"


def _timeline(prof) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, str]], float]:
    """(GPU activities as (start, end, launch) ns, the PHASES ranges as (start, end, name) ns, GPU busy ms) of a
    profile, from its Kineto events (a GPU activity's correlation id is that of the runtime call that launched it)."""
    events = prof.profiler.kineto_results.events()
    launch_ns, gpu, phases = {}, [], []
    for e in events:
        if e.device_type() == torch.autograd.DeviceType.CPU:
            if e.name() in PHASES:
                phases.append((e.start_ns(), e.end_ns(), e.name()))
            elif e.name().startswith("cu"):       # runtime and driver calls (cudaLaunchKernel, cuLaunchKernel)
                launch_ns[e.correlation_id()] = e.start_ns()
        elif not e.is_user_annotation():       # kernels, copies, memsets; not the ranges' GPU-side spans
            gpu.append(e)
    kernels = [(e.start_ns(), e.end_ns(), launch_ns.get(e.correlation_id(), launch_ns.get(e.linked_correlation_id(),
                                                                                       e.start_ns())))
               for e in gpu]
    busy, until = 0, None
    for start, end, _ in sorted(kernels):
        if until is None or start > until:
            busy += end - start
            until = end
        elif end > until:
            busy += end - until
            until = end
    return kernels, phases, busy / 1e6


def host_side(events, wall_ms: float, prof=None) -> dict:
    """Where the host holds the step up, from one profiled step's CUDA runtime calls: the calls that wait for the
    GPU (synchronisations, copies), grouped by the op that made them (count, ms), the 8 longest groups; the kernel
    launches (count, ms in the launch calls); the profiled step's wall time; and, given the profile (on a GPU), the
    GPU's busy time, its idle time by the phase whose launches ended each gap (:func:`gpu_idle_by_phase`) and the
    GPU activities each phase launched (:func:`launches_by_phase`)."""
    waits: dict[tuple[str, str], list] = {}
    launches, launch_us = 0, 0.0
    for event in events:
        name = event.name
        if name in _LAUNCH_CALLS:
            launches += 1
            launch_us += event.time_range.elapsed_us()
        elif name in _BLOCKING_CALLS:
            parent = event.cpu_parent
            while parent is not None and parent.cpu_parent is not None and not parent.name.startswith("aten::"):
                parent = parent.cpu_parent
            entry = waits.setdefault((name, parent.name if parent is not None else "-"), [0, 0.0])
            entry[0] += 1
            entry[1] += event.time_range.elapsed_us() / 1e3
    top = sorted(([call, op, n, round(ms, 3)] for (call, op), (n, ms) in waits.items()), key=lambda x: -x[3])[:8]
    result = {"wall_ms": round(wall_ms, 3), "launches": launches, "launch_ms": round(launch_us / 1e3, 3),
              "waits": top}
    if prof is not None:
        kernels, phases, busy_ms = _timeline(prof)
        if kernels:
            result["gpu_busy_ms"] = round(busy_ms, 3)
            result["gpu_idle_ms"] = gpu_idle_by_phase(kernels, phases)
            result["gpu_launches"] = launches_by_phase(kernels, phases)
    return result


def breakdown(arm: Arm, batch: dict) -> tuple[dict[str, float], list[list], dict]:
    """Milliseconds of GPU time (CPU op self time on a CPU) per category in one profiled step, the 40 kernels that
    took longest (name, ms, category) to check the categories against, and the host side (:func:`host_side`)."""
    cuda = arm.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    hooks = _scope_hooks(arm.model)
    try:
        with torch.profiler.profile(activities=activities) as prof:
            start = time.perf_counter()
            arm.step(batch)
            synchronize(arm.device)
            wall_ms = (time.perf_counter() - start) * 1e3
    finally:
        for h in hooks:
            h.remove()
    totals = dict.fromkeys(CATEGORIES, 0.0)
    per_kernel: dict[str, list] = {}
    for name, us, scopes in _timed_items(prof.events(), cuda):
        category = categorize(name, scopes)
        totals[category] += us / 1e3
        entry = per_kernel.setdefault(name[:120], [0.0, category])
        entry[0] += us / 1e3
    top = sorted(([n, ms, c] for n, (ms, c) in per_kernel.items()), key=lambda x: -x[1])[:40]
    return {k: round(v, 3) for k, v in totals.items()}, top, host_side(prof.events(), wall_ms, prof if cuda else None)


# ---------------------------------------------------------------------------------------------------------------
# the benchmark


def bench_crop(arms: list[Arm], batch: dict, crop: int, rounds: int, warmup: int, profile: bool = True) -> list[dict]:
    """Rows of one crop: warm-up (the first step's loss is loss0), interleaved timed rounds, peak, and with
    ``profile`` the breakdown."""
    live = [a for a in arms if a.slow_from is None]
    rows = {a.name: {"impl": a.name, "N": int(batch["token_mask"].shape[1])} for a in arms}
    cuda = batch["token_mask"].is_cuda
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    last_s: dict[str, float] = {}
    # warm-up interleaved as the timed rounds are, so that each arm's CUDA graphs are recorded among the other arms'
    # (warmed one arm after another, one timed round of each of the first two graphed arms re-recorded its graphs,
    # 15-22 s, in ro4 and ro5)
    for w in range(warmup):
        for arm in [a for a in live if a.slow_from is None]:
            try:
                last_s[arm.name], loss = timed_step(arm, batch)
            except Exception as error:   # an anchor that fails (compilation, an unsupported shape) drops its arm only
                arm.slow_from = crop
                rows[arm.name]["skipped"] = f"{type(error).__name__}: {str(error)[:300]}"
                print(f"{arm.name} at crop {crop}: {rows[arm.name]['skipped']}", flush=True)
                arm.optimizer.zero_grad(set_to_none=True)
                continue
            if w == 0:
                rows[arm.name]["loss0"] = loss
    for arm in live:
        if arm.slow_from is None and last_s[arm.name] > SLOW_STEP_S:   # the last warm-up step (the first ones
            arm.slow_from = crop                                       # compile and autotune)
            rows[arm.name]["skipped"] = f"a step took {last_s[arm.name]:.1f} s > {SLOW_STEP_S} s"
    live = [a for a in live if a.slow_from is None]
    times = {a.name: [] for a in live}
    for r in range(rounds):
        for arm in live[r % len(live):] + live[:r % len(live)] if live else []:
            times[arm.name].append(timed_step(arm, batch)[0])
    # the most device memory the process held at this crop, every arm's steps together: an upper bound of what one
    # arm needs (a graphed arm's activations live in the CUDA graphs' pool, which peak_mib does not see)
    reserved_mib = torch.cuda.max_memory_reserved() / 2**20 if cuda else None
    for arm in live:
        row, values = rows[arm.name], sorted(times[arm.name])
        row["step_s"] = statistics.median(values)
        row["step_spread_s"] = [values[0], values[-1]]
        row["step_rounds_s"] = times[arm.name]       # in round order: which round an outlier was
        row["crop_reserved_mib"] = reserved_mib
        # memory a step allocates above the weights and the optimizer state
        row["peak_mib"] = peak_mib(lambda: arm.step(batch)) if arm.device.type == "cuda" else None
        if profile:
            row["breakdown_ms"], row["top_kernels"], row["host"] = breakdown(arm, batch)
    for arm in arms:
        arm.release()
    return [rows[a.name] for a in arms]


def plot(rows: list[dict], path: Path) -> None:
    """Step time against crop per arm (left) and the GPU-time breakdown of the largest crop, stacked (right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    timed = [r for r in rows if "step_s" in r]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for name in dict.fromkeys(r["impl"] for r in timed):
        pts = sorted((r["N"], r["step_s"] * 1e3) for r in timed if r["impl"] == name)
        left.plot(*zip(*pts), marker="o", label=name, lw=2.5 if name.startswith("mini_of3") else 1.2)
    left.set_xlabel("crop (tokens)")
    left.set_ylabel("ms per training step (median)")
    left.set_yscale("log")
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize=8)
    left.set_title("training step")
    if timed:
        largest = max(r["N"] for r in timed)
        at = [r for r in timed if r["N"] == largest and "breakdown_ms" in r]
        bottom = [0.0] * len(at)
        for category in CATEGORIES:
            heights = [r["breakdown_ms"].get(category, 0.0) for r in at]
            right.bar(range(len(at)), heights, bottom=bottom, label=category)
            bottom = [b + h for b, h in zip(bottom, heights)]
        right.set_xticks(range(len(at)), [r["impl"] for r in at], rotation=30, ha="right", fontsize=8)
        right.set_ylabel("GPU ms in one profiled step")
        right.set_title(f"where the step's GPU time goes, crop {largest}")
        right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mini_of3.bench step", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG, help="a training config (its model and optim)")
    parser.add_argument("--crops", default="256,384,512,640,768", help="crop sizes, benchmarked in this order")
    parser.add_argument("--arms", default=DEFAULT_ARMS, help="comma-separated <tri_attn_backend>+<tri_mul_backend>[:compile mode]"
                        "[@model_key=value...] (the overrides apply to that arm's model only)")
    parser.add_argument("--data", default=None, help="a prepared folder (default: the config's data.cache_dir)")
    parser.add_argument("--rounds", type=int, default=5, help="timed steps per arm, interleaved")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per arm first (compilation, autotuning: "
                        "with compiled blocks and 2 warm-ups, one timed step at 768 took 4.9 s in the s9 sweep; "
                        f"an arm whose last one takes over {SLOW_STEP_S:.0f} s is not timed at this crop or above)")
    parser.add_argument("--entry", default=None, help="the entry to crop (id or PDB id; default: the one with the "
                        "most resolved tokens)")
    parser.add_argument("--pad", action="store_true", help="pad every crop to its size, as data.pad_to_crop does (a "
                        "small --entry then measures what padding costs)")
    parser.add_argument("--profile-crops", default=None,
                        help="crops whose GPU time is broken down by a profiled step (default: the largest)")
    parser.add_argument("--out", default="runs/bench", help="folder of the JSON and PNG (default: runs/bench)")
    parser.add_argument("--tag", default="", help="suffix of the result file names")
    args, overrides = parser.parse_known_args(argv)   # key=value overrides of the config, as for train.py
    args.config, cfg = load_bench_config(args.config, overrides, DEFAULT_CONFIG, ("model.n_recycles=0",))
    arm_names, crops = parse_arms(args.arms, cfg), parse_crops(args.crops)
    profiled = set(parse_crops(args.profile_crops)) if args.profile_crops else {max(crops)}
    if args.rounds < 1 or args.warmup < 1:
        raise SystemExit(f"--rounds and --warmup must be >= 1, got {args.rounds}, {args.warmup}")
    prepared = Path(args.data or cfg.data.cache_dir)
    if not (prepared / "manifest.tsv").is_file():
        raise SystemExit(f"{prepared}: no manifest.tsv (prepare the data first: python -m mini_of3.data.prepare "
                         f"SRC {prepared})")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.seed)
    state = copy.deepcopy(build_model(replace(cfg.model, tri_attn_backend="torch", tri_mul_backend="torch"))
                          .state_dict())
    arms = []
    for name in arm_names:
        try:
            arms.append(Arm(name, cfg, state, device))
        except ImportError as err:     # an anchor missing here is reported, not fatal
            print(f"skipped {name}: {err}", flush=True)
    result = result_header("step", package_versions(["cuequivariance-torch", "trifast", "openfold3"]))
    result["config"] = args.config
    out = Path(args.out)
    stem = f"step{('_' + args.tag) if args.tag else ''}"
    for crop in crops:
        batch, entry = real_crop(prepared, crop, device, args.entry, args.pad)
        real = int(batch["token_mask"].sum())
        print(f"crop {crop}: {entry}, {batch['token_mask'].shape[1]} tokens ({real} real)", flush=True)
        for row in bench_crop(arms, batch, crop, args.rounds, args.warmup, crop in profiled):
            result["rows"].append({**row, "crop": crop, "entry": entry, "real_tokens": real})
        write_json(result, out / f"{stem}.json")
    rows = result["rows"]
    plot(rows, out / f"{stem}.png")
    print()
    print_table([{**r, "step_ms": r.get("step_s", 0) * 1e3 or None} for r in rows],
                [("impl", "arm", "s"), ("N", "N", "d"), ("step_ms", "step ms", ".1f"), ("peak_mib", "peak MiB", ".0f"),
                 ("crop_reserved_mib", "crop reserved MiB", ".0f"), ("loss0", "loss0", ".4f")])
    for r in (r for r in rows if r.get("host")):
        host, gpu = r["host"], sum(r["breakdown_ms"].values())
        print(f"{r['impl']} at {r['N']}: profiled step {host['wall_ms']:.0f} ms wall, {gpu:.0f} ms GPU, "
              f"{host['launches']} launches ({host['launch_ms']:.0f} ms); waits: "
              + ", ".join(f"{call} in {op} x{n} {ms:.1f} ms" for call, op, n, ms in host["waits"][:4]))
        if "gpu_idle_ms" in host:
            print(f"    GPU busy {host['gpu_busy_ms']:.0f} ms; idle by phase: "
                  + ", ".join(f"{name.removeprefix('bench::')} {ms:.1f}" for name, ms in host["gpu_idle_ms"].items()))
            print("    GPU activities launched by phase: "
                  + ", ".join(f"{name.removeprefix('bench::')} {n}" for name, n in host["gpu_launches"].items()))
    print(f"\nwrote {out / (stem + '.json')} and {out / (stem + '.png')}")


if __name__ == "__main__":
    main()
