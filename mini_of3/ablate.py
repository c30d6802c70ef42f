"""``python -m mini_of3.ablate crops [CONFIG] [options] [key=value ...]``: what a larger training crop buys.

Arms (:mod:`mini_of3.ablation.plan`): one per ``--crops`` value and the AF3 schedule (``--schedule 384:768``: the
smaller crop, then the larger for the last quarter of the same steps); with ``--activation softmax,sigmoid`` one
per activation at the first crop instead. Each arm trains the config's model (``configs/ablation.yaml``: a small
Pairformer, so that every arm and seed fits in about 45 minutes of one GPU) for the same ``--steps`` from each of
``--seeds``, with the real trainer, and is then scored on whole entries (:mod:`mini_of3.ablation.scoring`): the
training entries above 384 tokens (what a crop limits), those of at most 256 (the control) and the validation
set; at equal steps (the last checkpoint) and at equal GPU time (each arm's last checkpoint within the first arm's
GPU time, a step of each crop timed alone first: :mod:`mini_of3.ablation.cost`). Beside them, per seed: the
untrained model and a random compact chain. The paired differences between arms over seeds and entries, with
bootstrap 95 % intervals (:mod:`mini_of3.ablation.stats`), say what the crop changed.

Each arm trains in ``<folder>/seed<k>/<arm>`` and leaves ``arm.json`` (its scores) when finished, its checkpoints
then removed; a finished arm is skipped when the command runs again and an interrupted one resumes, so an
ablation can span several GPU sessions, and arms can train side by side (``--only``, one process each) once
``--calibrate`` has timed every kind of step alone (``<folder>/step_costs.json``; a run without ``--only`` does it
first by itself); ``--only baselines`` scores the baselines beside them (else the run without ``--only`` does).
Writes ``<out>/ablation_<kind>[_tag].json`` and ``.png`` (``--out``: the ablation folder unless given).

    python -m mini_of3.ablate crops configs/ablation.yaml --seeds 0,1,2 --steps 2000
    python -m mini_of3.ablate crops configs/ablation.yaml --steps 2000 --calibrate      # then --only ARM per process
    python -m mini_of3.ablate crops configs/ablation.yaml --crops 384 --activation softmax,sigmoid
"""
from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from mini_of3.ablation import cost
from mini_of3.ablation import plan as planning
from mini_of3.ablation import slots
from mini_of3.ablation.figure import SPLITS, plot
from mini_of3.ablation.scoring import LARGE, METRICS, SMALL, score_model, score_random_chains, scoring_entries
from mini_of3.ablation.stats import compare, entry_values
from mini_of3.bench.common import print_table, result_header, write_json
from mini_of3.bench.trainrun import command_overrides, config_argument, load, prepare_once, run_trainer

DEFAULT_CONFIG = "configs/ablation.yaml"
ACTIVATIONS = ("softmax", "sigmoid")
OPTIONS = ("--crops, --schedule, --seeds, --steps, --activation, --score-samples, --score-steps, --hours, --only, "
           "--calibrate, --calibration-steps, --out, --tag")
CALIBRATION_STEPS = 40
COSTS = "step_costs.json"
BASELINES = "baselines"                 # --only's name for the untrained model's and random chain's scoring
COMPARED = ("lddt_ca", "tm_score", "contact_precision", "interchain_contact_precision", "interface_lddt")


def say(message: str) -> None:
    print(f"ablate: {message}", file=sys.stderr, flush=True)


def parse_list(text: str, option: str, convert, what: str) -> list:
    """``a,b,c`` -> converted items, in order; one clear line on an empty list, a bad item or a repeat."""
    items = [i.strip() for i in text.split(",") if i.strip()]
    try:
        values = [convert(i) for i in items]
    except ValueError:
        values = []
    if not values:
        raise SystemExit(f"{option}: expected comma-separated {what}, got {text!r}")
    if len(set(values)) != len(values):
        raise SystemExit(f"{option}: {text!r} names one value twice")
    return values


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def activation(text: str) -> str:
    if text not in ACTIVATIONS:
        raise ValueError(text)
    return text


def schedule(text: str) -> tuple[int, int] | None:
    if text == "none":
        return None
    start, _, end = text.partition(":")
    try:
        pair = (positive(start), positive(end))
    except ValueError:
        raise SystemExit(f"--schedule: expected START:END crops (e.g. 384:768) or none, got {text!r}") from None
    if pair[1] <= pair[0]:
        raise SystemExit(f"--schedule {text}: the fine-tuning crop must be the larger")
    return pair


# ---------------------------------------------------------------------------------------------------------------
# one arm, one seed


def load_ema(checkpoint: Path, device):
    """The EMA model of a checkpoint folder."""
    from mini_of3.predict import load_model
    return load_model(checkpoint, device, prefer="latest", say=say)


def equal_time_checkpoint(arm: planning.Arm, seed: int, folder: Path, steps: int, costs: dict[str, float],
                          budget_s: float):
    """The arm's last checkpoint (the schedule arm's start run included) within ``budget_s`` of GPU time."""
    from mini_of3.training.checkpoint import list_checkpoints
    runs = [planning.arm_folder(folder, seed, arm)]
    if arm.impl == "finetune":
        runs.insert(0, planning.start_folder(folder, seed, arm))
    infos = {c.step: c for run in runs for c in list_checkpoints(run)}        # the arm's own run wins a tie
    return infos[cost.equal_time_step(arm, list(infos), steps, costs, budget_s)]


def arm_summary(arm: planning.Arm, seed: int, log: list[dict], steps: int, costs: dict[str, float]) -> dict:
    """The arm's training: median step time over the last three quarters of its steps (the first ones compile and
    autotune), peak memory (GPU), the minutes of its steps as they ran (``gpu_minutes``: beside whatever shared the
    GPU) and at each kind of step's cost alone (``gpu_minutes_alone``: the equal-time clock)."""
    train = [r for r in log if r.get("split") == "train"]
    peaks = [r["peak_mem_gib"] for r in train if r.get("peak_mem_gib") is not None]
    step = train[-1]["step"]
    return {"impl": arm.impl, "arm": arm.name, "N": arm.crop, "activation": arm.activation, "seed": seed,
            "step": step, "step_s": statistics.median(r["step_s"] for r in train[len(train) // 4:]),
            "peak_mib": max(peaks) * 1024 if peaks else None, "gpu_minutes": train[-1]["train_s"] / 60,
            "gpu_minutes_alone": cost.arm_seconds(arm, step, steps, costs) / 60}


def train_run(config: str, common: list[str], keys: list[str], prepared: Path, max_steps: int):
    """The real trainer on ``config`` with the ablation's ``common`` keys and then ``keys``, reading ``prepared``,
    to ``max_steps``; its :class:`TrainResult`."""
    cfg = load(config, [*common, *keys])
    return run_trainer(replace(cfg, data=replace(cfg.data, root=str(prepared)),
                               trainer=replace(cfg.trainer, max_steps=max_steps)))


def card(device) -> str:
    """The device's name, as the results record it."""
    import torch
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def run_arm(arm: planning.Arm, seed: int, steps: int, *, config: str, common: list[str], folder: Path,
            prepared: Path, stop_at: int | None = None, first_part: bool = False) -> Path:
    """Train one arm of one seed to ``steps`` (or only to ``stop_at``; a schedule arm's ``first_part``: its start
    crop's run), resuming its folder; returns the folder."""
    from mini_of3.training.checkpoint import list_checkpoints
    run_dir = planning.start_folder(folder, seed, arm) if first_part else planning.arm_folder(folder, seed, arm)
    keys = planning.arm_overrides(arm, folder, seed, steps, started=bool(list_checkpoints(run_dir)),
                                  first_part=first_part)
    done = train_run(config, common, keys, prepared, stop_at or steps)
    if done.stopped_by is not None:
        raise SystemExit(f"seed {seed} {arm.name}: stopped by {done.stopped_by} at step {done.step}; run the same "
                         f"command again to resume it")
    return run_dir


def train_arm(arm: planning.Arm, seed: int, steps: int, **where) -> None:
    """Train one arm; a schedule arm first trains its start crop to three quarters of the steps (unless its own
    part has begun), then goes on from there at its larger crop."""
    from mini_of3.training.checkpoint import list_checkpoints
    if arm.impl == "finetune" and not list_checkpoints(planning.arm_folder(where["folder"], seed, arm)):
        run_arm(arm, seed, steps, stop_at=planning.finetune_start(steps), first_part=True, **where)
        say(f"seed {seed} {arm.name}: from crop {arm.start_crop} at step {planning.finetune_start(steps)}")
    run_arm(arm, seed, steps, **where)


def score_arm(arm: planning.Arm, seed: int, folder: Path, entries, steps: int, costs: dict[str, float],
              budget_s: float, score: dict, device, began: float) -> dict:
    """Score an arm's last checkpoint (equal steps) and its last within ``budget_s`` of GPU time at each kind of
    step's cost alone (equal GPU time); write and return ``arm.json`` (``wall_minutes``: since ``began``, the
    monotonic clock when its training started in this command; ``score_minutes``: the scoring's share;
    ``score_wait_minutes``: the wait for a scoring slot, :mod:`mini_of3.ablation.slots`;
    ``score_peak_mib``: the GPU memory it reserved at most, what processes beside it must leave); remove the
    checkpoints."""
    from mini_of3.training.checkpoint import list_checkpoints
    from mini_of3.training.runlog import read_log
    free_memory()
    run_dir = planning.arm_folder(folder, seed, arm)
    summary = arm_summary(arm, seed, read_log(run_dir / "log.jsonl"), steps, costs)
    budgets = {"steps": list_checkpoints(run_dir)[-1],
               "time": equal_time_checkpoint(arm, seed, folder, steps, costs, budget_s)}
    scored: dict[int, list[dict]] = {}
    rows = []
    waited = time.monotonic()
    with slots.slot():                                          # arms beside it score in turn: GPU memory
        scoring_began = time.monotonic()
        reset_peak(device)
        for checkpoint in budgets.values():
            if checkpoint.step not in scored:
                model, _, _ = load_ema(checkpoint.path, device)
                scored[checkpoint.step] = score_model(model, entries, device=device, seed=seed, **score)
                del model
        free_memory()
        scored_at = time.monotonic()
    for budget, checkpoint in budgets.items():
        rows += [{"impl": arm.impl, "arm": arm.name, "N": arm.crop, "activation": arm.activation, "seed": seed,
                  "budget": budget, "step": checkpoint.step, **r} for r in scored[checkpoint.step]]
    now = time.monotonic()
    result = {"summary": {**summary, "wall_minutes": (now - began) / 60,
                          "score_minutes": (scored_at - scoring_began) / 60,
                          "score_wait_minutes": (scoring_began - waited) / 60,
                          "score_peak_mib": reserved_peak_mib(device), "device": card(device)},
              "rows": rows}
    write_json(result, run_dir / "arm.json")
    for checkpoints in (run_dir / "checkpoints", run_dir / "start" / "checkpoints"):
        shutil.rmtree(checkpoints, ignore_errors=True)
    return result


def calibrate(kinds: list[tuple[int, str]], calibration_steps: int, seed: int, device, *, config: str,
              common: list[str], folder: Path, prepared: Path) -> None:
    """Time each kind of step (crop, activation) alone: ``calibration_steps`` steps of the real trainer from
    ``seed`` (the same entries for every kind) in a scratch run, removed after; write ``<folder>/step_costs.json``
    (per kind the cost of :func:`cost.mean_step_seconds` and every step time; the device)."""
    from mini_of3.training.runlog import read_log
    costs, times = {}, {}
    for crop, act in kinds:
        name = cost.kind(crop, act)
        run_dir = folder / "calibration" / name
        shutil.rmtree(run_dir, ignore_errors=True)
        keys = {"seed": seed, "data.crop_size": crop, "model.tri_attn_activation": act, "trainer.out_dir": run_dir,
                "trainer.checkpoint_every": 10 ** 9, "trainer.val_every": 10 ** 9}   # validated at start and end only
        train_run(config, common, [f"{k}={v}" for k, v in keys.items()], prepared, calibration_steps)
        times[name] = [r["step_s"] for r in read_log(run_dir / "log.jsonl") if r.get("split") == "train"]
        costs[name] = cost.mean_step_seconds(times[name])
        say(f"calibration: {name} {costs[name]:.3f} s a step alone (of {len(times[name])} steps, the first "
            f"{cost.WARMUP} and those above {cost.SPIKE:g}x the median left out)")
    shutil.rmtree(folder / "calibration", ignore_errors=True)
    write_json({"device": card(device), "steps": calibration_steps, "warmup": cost.WARMUP, "spike": cost.SPIKE,
                "step_s": costs, "step_times": times}, folder / COSTS)


def baselines(cfg, seed: int, entries, score: dict, device, path: Path) -> list[dict]:
    """The untrained model (the initial weights every arm of ``seed`` starts from) and a random compact chain,
    scored on every entry; cached in ``path``."""
    if path.is_file():
        return json.loads(path.read_text())["rows"]
    began = time.monotonic()
    reset_peak(device)
    from accelerate.utils import set_seed
    from mini_of3.model import build_model
    set_seed(seed)                                              # as the trainer does before building the model
    model = build_model(cfg.model).to(device)
    with slots.slot():
        rows = [{"impl": "untrained", "seed": seed, "budget": "steps", **r}
                for r in score_model(model, entries, device=device, seed=seed, **score)]
    rows += [{"impl": "random_chain", "seed": seed, "budget": "steps", **r}
             for r in score_random_chains(entries, seed, device)]
    del model
    write_json({"rows": rows}, path)
    peak = reserved_peak_mib(device)
    say(f"seed {seed}: baselines scored in {(time.monotonic() - began) / 60:.1f} min"
        + (f", {peak:.0f} MiB of GPU memory reserved at most" if peak is not None else ""))
    return rows


def reset_peak(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def reserved_peak_mib(device) -> float | None:
    """The GPU memory this process reserved at most since :func:`reset_peak` (None off the GPU)."""
    import torch
    return torch.cuda.max_memory_reserved(device) / 2 ** 20 if device.type == "cuda" else None


def free_memory() -> None:
    gc.collect()
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------------------------
# the result


def comparisons(rows: list[dict], arms: list[planning.Arm]) -> list[dict]:
    """Paired differences (a - b) over seeds and entries, per split, metric and budget: every arm against the first
    (the smallest crop, or the first activation), the schedule arm against both its crops, every arm against the
    random chain and the untrained model (equal steps)."""
    pairs = [(a, arms[0]) for a in arms[1:]]
    pairs += [(a, b) for a in arms if a.impl == "finetune" for b in arms
              if b.impl == "crop" and b.crop in (a.start_crop, a.crop)]
    out = []
    for split in SPLITS:
        for metric in COMPARED:
            for budget in ("steps", "time"):
                for a, b in pairs:
                    out.append({"a": a.name, "b": b.name, "split": split, "metric": metric, "budget": budget,
                                **compare(entry_values(rows, a.impl, a.name, split, metric, budget),
                                          entry_values(rows, b.impl, b.name, split, metric, budget))})
            for a in arms:
                for base in ("random_chain", "untrained"):
                    out.append({"a": a.name, "b": base, "split": split, "metric": metric, "budget": "steps",
                                **compare(entry_values(rows, a.impl, a.name, split, metric),
                                          entry_values(rows, base, None, split, metric))})
    return out


def report(result: dict) -> None:
    """The arms' training, then the comparisons of lDDT-Calpha, as tables."""
    summaries = [r for r in result["rows"] if not r.get("entry") and r["impl"] not in ("untrained", "random_chain")]
    print_table(summaries, [("arm", "arm", "s"), ("seed", "seed", "d"), ("step", "steps", "d"),
                            ("step_s", "step s", ".3f"), ("gpu_minutes", "GPU min", ".1f"),
                            ("gpu_minutes_alone", "GPU min alone", ".1f"),
                            ("peak_mib", "peak MiB", ".0f")])
    print()
    shown = [c for c in result["comparisons"] if c["metric"] == "lddt_ca"]
    print_table(shown, [("split", "split", "s"), ("budget", "budget", "s"), ("a", "a", "s"), ("b", "b", "s"),
                        ("mean", "a - b", "+.3f"), ("lo", "95% lo", "+.3f"), ("hi", "95% hi", "+.3f"),
                        ("pairs", "pairs", "d")])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mini_of3.ablate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["crops"], help="the ablation (crops; --activation varies the activation)")
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG, help="a training config")
    parser.add_argument("--crops", default="256,384,512,768", help="comma-separated training crops (tokens)")
    parser.add_argument("--schedule", default="384:768", help="the AF3 schedule arm START:END, or none")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds: every arm trains from each")
    parser.add_argument("--steps", type=int, default=None, help="training steps of every arm (default: the "
                        "config's trainer.max_steps)")
    parser.add_argument("--activation", default=None, help="comma-separated triangle attention activations to "
                        "ablate at the first crop (softmax, sigmoid)")
    parser.add_argument("--score-samples", type=int, default=1, help="structures sampled per scored entry")
    parser.add_argument("--score-steps", type=int, default=20, help="EDM steps of the scoring samples")
    parser.add_argument("--large-tokens", type=int, default=LARGE, help="train_large: training entries above this")
    parser.add_argument("--small-tokens", type=int, default=SMALL, help="train_small: training entries up to this")
    parser.add_argument("--hours", type=float, default=None, help="start no arm that would end after this many "
                        "hours of the command (judged by the same arm's time in a finished seed); run the command "
                        "again to go on")
    parser.add_argument("--only", default=None, help="comma-separated arms (e.g. crop384,finetune384to768) to train "
                        "in this command, the others left for another (after --calibrate, so that processes may "
                        "train side by side), and 'baselines' to score each seed's untrained model and random chain "
                        "here (else the command without --only does); the result is written once every arm has "
                        "finished")
    parser.add_argument("--calibrate", action="store_true", help="time every kind of step alone on this device "
                        "(<folder>/step_costs.json: the equal-time clock), then stop; run it with the GPU to itself")
    parser.add_argument("--calibration-steps", type=int, default=CALIBRATION_STEPS, help="steps per kind of step "
                        f"in the calibration (the first {cost.WARMUP} not timed)")
    parser.add_argument("--out", default=None, help="folder of the JSON and PNG (default: the ablation folder)")
    parser.add_argument("--tag", default="", help="suffix of the ablation folder and result file names")
    args, extra = parser.parse_known_args(argv)
    config, user = config_argument(args.config, extra, DEFAULT_CONFIG, OPTIONS)
    crops = parse_list(args.crops, "--crops", positive, "crop sizes (integers >= 1)")
    seeds = parse_list(args.seeds, "--seeds", non_negative, "seeds (integers >= 0)")
    activations = None if args.activation is None else \
        parse_list(args.activation, "--activation", activation, f"activations ({', '.join(ACTIVATIONS)})")
    chosen_schedule = schedule(args.schedule) if activations is None else None
    if args.hours is not None and not args.hours > 0:
        raise SystemExit(f"--hours must be > 0, got {args.hours}")
    if args.calibration_steps < 1:
        raise SystemExit(f"--calibration-steps must be >= 1, got {args.calibration_steps}")
    if args.score_samples < 1 or args.score_steps < 1:
        raise SystemExit(f"--score-samples and --score-steps must be >= 1, got {args.score_samples}, "
                         f"{args.score_steps}")
    kind = "crops" if activations is None else "activation"
    stem = f"ablation_{kind}{('_' + args.tag) if args.tag else ''}"
    folder_keys = [o for o in user if o.partition("=")[0].strip() == "trainer.out_dir"]
    user = [o for o in user if o not in folder_keys]                      # names the ablation folder, not a run
    folder = Path(folder_keys[-1].partition("=")[2] if folder_keys else f"runs/{stem}")
    fixed = {"trainer.resume": "auto", "trainer.max_minutes": "null"}
    cfg = load(config, command_overrides(user, {}, fixed, f"the ablation ({OPTIONS})",
                                         reserved=["seed", "data.crop_size"]))
    try:
        arms = planning.plan_arms(crops, chosen_schedule, activations, cfg.model.tri_attn_activation)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    names = [a.name for a in arms]
    only = [*names, BASELINES] if args.only is None else parse_list(args.only, "--only", str,
                                                                     f"arms ({', '.join(names)})")
    if unknown := [a for a in only if a not in (*names, BASELINES)]:
        raise SystemExit(f"--only: {', '.join(unknown)} is not an arm of this ablation ({', '.join(names)}) "
                         f"nor {BASELINES}")
    cfg, prepared = prepare_once(cfg)
    steps = args.steps or cfg.trainer.max_steps
    if steps < 1:
        raise SystemExit(f"--steps must be >= 1, got {steps}")
    from mini_of3.data import resolve_validation
    cfg = replace(cfg, data=resolve_validation(prepared, cfg.data))
    if not cfg.data.val_ids:
        raise SystemExit(f"{prepared}: no validation entries (data.val_ids={cfg.data.val_ids}, data.val_after="
                         f"{cfg.data.val_after}); the arms are scored on named validation entries: data.val_ids=auto "
                         f"chooses them")
    fixed.update({"trainer.checkpoint_every": planning.checkpoint_every(steps), "trainer.keep_last": 1000})
    common = command_overrides(user, {}, fixed, f"the ablation ({OPTIONS})", reserved=["seed", "data.crop_size"])
    common.append("data.val_ids=[" + ",".join(cfg.data.val_ids) + "]")          # resolved once: every arm the same
    check_plan(folder, {"config": config, "overrides": common, "steps": steps, "val_ids": cfg.data.val_ids,
                        "score": [args.score_samples, args.score_steps, args.large_tokens, args.small_tokens]})
    import torch
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    where = dict(config=config, common=common, folder=folder, prepared=prepared)
    if args.calibrate or not (folder / COSTS).is_file():
        if args.only is not None and not args.calibrate:
            raise SystemExit(f"{folder / COSTS}: no step costs yet, and --only trains beside other processes: run "
                             f"the same command with --calibrate instead of --only first, with the GPU to itself")
        calibrate(cost.step_kinds(arms), args.calibration_steps, cfg.seed, device, **where)
        if args.calibrate:
            return
    costs = json.loads((folder / COSTS).read_text())["step_s"]
    if missing := [cost.kind(*k) for k in cost.step_kinds(arms) if cost.kind(*k) not in costs]:
        raise SystemExit(f"{folder / COSTS} has no cost for {', '.join(missing)}; run the same command with "
                         f"--calibrate (alone on the GPU) to time them")
    entries = scoring_entries(prepared, cfg.data, cfg.seed, args.large_tokens, args.small_tokens)
    counts = {s: sum(e.split == s for e in entries) for s in SPLITS}
    say(f"{len(arms)} arms x {len(seeds)} seeds, {steps} steps each; scored on {counts['train_large']} large and "
        f"{counts['train_small']} small training entries and {counts['val']} validation entries "
        f"({', '.join(cfg.data.val_ids)}), whole")
    score = {"samples": args.score_samples, "steps": args.score_steps,
             "bf16": cfg.trainer.mixed_precision == "bf16"}
    rows, left = [], []
    started = time.monotonic()
    def baseline_rows(seed: int) -> list[dict]:
        return baselines(replace(cfg, seed=seed), seed, entries, score, device,
                         folder / f"seed{seed}" / "baselines.json")

    budget_s = cost.arm_seconds(arms[0], steps, steps, costs)      # the first arm's GPU time: the equal-time budget
    for seed in seeds:
        if BASELINES in only:
            baseline_rows(seed)
        for arm in arms:
            run_dir = planning.arm_folder(folder, seed, arm)
            if (run_dir / "arm.json").is_file():
                result = json.loads((run_dir / "arm.json").read_text())
                say(f"seed {seed} {arm.name}: finished before, skipped")
            elif arm.name not in only:
                left.append(f"seed {seed} {arm.name}")
                continue
            else:
                check_time_left(args.hours, started, folder, seed, arm)
                began = time.monotonic()
                train_arm(arm, seed, steps, **where)
                result = score_arm(arm, seed, folder, entries, steps, costs, budget_s, score, device, began)
                s = result["summary"]
                say(f"seed {seed} {arm.name}: {s['step']} steps, {s['gpu_minutes']:.1f} GPU min as run "
                    f"({s['gpu_minutes_alone']:.1f} alone), median step {s['step_s']:.3f} s, "
                    f"{s['wall_minutes']:.1f} min trained and scored ({s['score_minutes']:.1f} scoring)")
            rows += [result["summary"], *result["rows"]]
    if left:
        say(f"{len(left)} of {len(arms) * len(seeds)} arms not trained yet ({', '.join(left)}): the result is "
            f"written once every arm has finished")
        return
    for seed in seeds:
        rows += baseline_rows(seed)                                  # read back where scored before

    result = result_header("ablation", prog="python -m mini_of3.ablate")
    result.update(kind=kind, config=config, overrides=common, folder=str(folder), steps=steps, seeds=seeds,
                  val_ids=cfg.data.val_ids,
                  score={"samples": args.score_samples, "steps": args.score_steps, "large_tokens": args.large_tokens,
                         "small_tokens": args.small_tokens},
                  arms=[{**asdict(a), "name": a.name} for a in arms], metrics=list(METRICS), rows=rows,
                  entries=[{"entry": e.id, "split": e.split, "tokens": e.tokens} for e in entries])
    result["comparisons"] = comparisons(rows, arms)
    out = Path(args.out) if args.out else folder
    write_json(result, out / f"{stem}.json")
    plot(result, out / f"{stem}.png")
    print()
    report(result)
    print(f"\nwrote {out / (stem + '.json')} and {out / (stem + '.png')}")


def check_time_left(hours: float | None, started: float, folder: Path, seed: int, arm: planning.Arm) -> None:
    """Stop the command (one line) before an arm that would end after ``hours`` of it, judged by the longest time
    the same arm took to train and score in another seed; an arm not yet timed always starts."""
    if hours is None:
        return
    times = [json.loads(path.read_text())["summary"].get("wall_minutes", 0.0) * 60
             for path in folder.glob(f"seed*/{arm.name}/arm.json")]
    left = hours * 3600 - (time.monotonic() - started)
    if times and max(times) > left:
        raise SystemExit(f"--hours {hours:g}: seed {seed} {arm.name} took {max(times) / 60:.1f} min in another seed "
                         f"and {left / 60:.1f} min are left; run the same command again to go on")


def check_plan(folder: Path, plan: dict) -> None:
    """Write the ablation folder's ``plan.json``, or check that it holds the same config, overrides, steps,
    validation set and scoring (an arm trained under another plan would not compare); seeds and arms may be added."""
    path = folder / "plan.json"
    if path.is_file():
        before = json.loads(path.read_text())
        changed = sorted(k for k in plan if before.get(k) != plan[k])
        if changed:
            raise SystemExit(f"{folder} holds an ablation with another {', '.join(changed)} ({path}); use another "
                             f"--tag or trainer.out_dir, or remove the folder")
    else:
        write_json(plan, path)


if __name__ == "__main__":
    main()
