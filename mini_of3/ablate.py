"""``python -m mini_of3.ablate crops [CONFIG] --crops 256,384,512,768 [--minutes M | --steps S] [options]
[key=value ...]``: what the training crop buys for the same training budget.

One arm per crop: the same model from the same seed, trained by the real trainer (:class:`mini_of3.trainer.Trainer`)
with ``data.crop_size`` = the arm's crop, for the same budget: ``--minutes M`` of training steps per arm
(``trainer.max_minutes``: validation, checkpoints and compiling do not count) or ``--steps S`` (without either, the
config's own ``trainer.max_steps`` / ``trainer.max_minutes``). Every arm validates on the same tokens: the config's
validation entries cropped to ``--val-crop`` (768) tokens whatever the training crop (``data.val_crop_size``), so an
entry of up to 768 tokens is validated whole. Each run validates its untrained model at step 0 (same seed, same
entries, so the same for every arm of one model); the first arm's is the baseline (``impl`` "untrained").
``--activation softmax,sigmoid`` ablates ``model.tri_attn_activation`` instead, at one crop (the first of
``--crops``): rows with ``impl`` "activation" and one untrained row per activation.

    python -m mini_of3.ablate crops configs/crop768.yaml --crops 256,384,512,768 --minutes 20
    python -m mini_of3.ablate crops configs/crop384.yaml --crops 384 --activation softmax,sigmoid --minutes 20

Each arm trains in its own folder, ``<ablation folder>/crop<N>`` (or ``activation_<name>``); the ablation folder is
``runs/ablate_<crops|activation>[_tag]`` unless ``trainer.out_dir=...`` names it. A finished arm leaves ``arm.json``
there and is skipped when the command runs again; an interrupted one resumes from its last checkpoint
(``trainer.resume=auto``). Writes ``<out>/ablation_<crops|activation>[_tag].json`` (rows: impl, N, activation,
step_s, peak_mib, steps, val_lddt_ca, val_contact_precision, val_distogram_loss, ...) and ``.png``.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from mini_of3.bench.common import print_table, result_header, write_json
from mini_of3.bench.trainrun import command_overrides, config_argument, load, prepare_once, run_trainer, \
    validation_rows

DEFAULT_CONFIG = "configs/default.yaml"
ACTIVATIONS = ("softmax", "sigmoid")
UNLIMITED_STEPS = 10**9                     # --minutes: the time budget alone ends an arm
VAL_KEYS = {"val_lddt_ca": "lddt_ca", "val_contact_precision": "contact_precision",
            "val_distogram_loss": "distogram", "val_tm_score": "tm_score", "val_rmsd": "rmsd",
            "val_distogram_accuracy": "distogram_accuracy", "val_loss": "loss", "val_mean_plddt": "mean_plddt"}
OPTIONS = "--crops, --minutes, --steps, --activation, --val-crop, --out, --tag"


@dataclass(frozen=True)
class Arm:
    impl: str             # "crop" or "activation": the factor this arm varies
    crop: int
    activation: str

    @property
    def name(self) -> str:
        return f"crop{self.crop}" if self.impl == "crop" else f"activation_{self.activation}"


# ---------------------------------------------------------------------------------------------------------------
# arguments


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


def crop_size(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def activation(text: str) -> str:
    if text not in ACTIVATIONS:
        raise ValueError(text)
    return text


def plan_arms(crops: list[int], activations: list[str] | None, config_activation: str) -> list[Arm]:
    """The crop arms, or with ``activations`` the activation arms at the first crop."""
    if activations is None:
        return [Arm("crop", c, config_activation) for c in crops]
    if len(crops) > 1:
        say(f"--activation: the arms train at crop {crops[0]}, the first of --crops")
    return [Arm("activation", crops[0], a) for a in activations]


def budget_overrides(minutes: float | None, steps: int | None) -> dict[str, object]:
    """The keys that set the training budget of every arm (none: the config's budget)."""
    if minutes is not None and steps is not None:
        raise SystemExit("--minutes and --steps: give one training budget, not both")
    if minutes is not None:
        if not minutes > 0:
            raise SystemExit(f"--minutes must be > 0, got {minutes}")
        return {"trainer.max_minutes": minutes, "trainer.max_steps": UNLIMITED_STEPS}
    if steps is not None:
        if steps < 1:
            raise SystemExit(f"--steps must be >= 1, got {steps}")
        return {"trainer.max_steps": steps, "trainer.max_minutes": "null"}
    return {}


def say(message: str) -> None:
    print(f"ablate: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# one arm


def arm_overrides(arm: Arm, folder: Path) -> list[str]:
    """The keys that differ between arms: the crop (or activation) and the run folder."""
    keys = {"data.crop_size": arm.crop, "trainer.out_dir": folder / arm.name}
    if arm.impl == "activation":
        keys["model.tri_attn_activation"] = arm.activation
    return [f"{k}={v}" for k, v in keys.items()]


def val_metrics(val_row: dict) -> dict:
    """The ``val_*`` fields of a row from one validation row of a run's log, and the entries it scored."""
    out = {key: val_row.get(name) for key, name in VAL_KEYS.items()}
    out["val_entries"] = [e["id"] for e in val_row["entries"]]
    out["val_tokens"] = [e.get("tokens") for e in val_row["entries"]]
    return out


def arm_result(arm: Arm, log: list[dict], run_dir: Path, train_s: float) -> dict:
    """``{"row": ..., "untrained": ...}`` of a finished arm from its log: the median step time over the last three
    quarters of the steps (the first ones compile and autotune, as ``bench runs``), the training peak memory (GPU
    only), the last validation, and the step-0 validation (the untrained model)."""
    train = [r for r in log if r.get("split") == "train"]
    val = validation_rows(log)
    if not train or not val or val[0]["step"] != 0:
        raise SystemExit(f"{run_dir}: the log has no training steps or no step-0 validation; remove the folder and "
                         f"run the command again")
    peaks = [r["peak_mem_gib"] for r in train if r.get("peak_mem_gib") is not None]
    row = {"impl": arm.impl, "N": arm.crop, "activation": arm.activation,
           "step_s": statistics.median(r["step_s"] for r in train[len(train) // 4:]),
           "peak_mib": max(peaks) * 1024 if peaks else None, "steps": train[-1]["step"],
           "train_minutes": train_s / 60, **val_metrics(val[-1]), "val_step": val[-1]["step"],
           "run_dir": str(run_dir)}
    untrained = {"impl": "untrained", "N": None, "activation": arm.activation, "step_s": None, "peak_mib": None,
                 "steps": 0, "train_minutes": 0.0, **val_metrics(val[0]), "val_step": 0, "run_dir": str(run_dir)}
    return {"row": row, "untrained": untrained}


def run_arm(arm: Arm, config: str, overrides: list[str], prepared: Path) -> dict:
    """Train and validate one arm (resuming its folder), write its ``arm.json``; returns what it holds."""
    from mini_of3.training.runlog import read_log
    cfg = load(config, overrides)
    cfg = replace(cfg, data=replace(cfg.data, root=str(prepared)))        # prepared once for all arms
    done = run_trainer(cfg)
    if done.stopped_by is not None:
        raise SystemExit(f"{arm.name}: stopped by {done.stopped_by} at step {done.step}; run the same command "
                         f"again to resume it")
    result = arm_result(arm, read_log(done.out_dir / "log.jsonl"), done.out_dir, done.train_s)
    write_json(result, done.out_dir / "arm.json")
    gc.collect()
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


# ---------------------------------------------------------------------------------------------------------------
# the result


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Validation quality (lDDT-Calpha, contact precision; distogram loss) against the crop (or activation) beside
    step time and peak memory; the untrained model dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    arms = [r for r in rows if r["impl"] != "untrained"]
    untrained = {r["activation"]: r for r in rows if r["impl"] == "untrained"}
    by_crop = arms[0]["impl"] == "crop"
    x = [r["N"] for r in arms] if by_crop else list(range(len(arms)))
    panels = ((("val_lddt_ca", "lDDT-Calpha"), ("val_contact_precision", "contact precision")),
              (("val_distogram_loss", "distogram loss"),), (("step_s", "median step (s)"),),
              (("peak_mib", "peak memory (MiB)"),))
    fig, axes = plt.subplots(1, len(panels), figsize=(18, 4.2), sharex=True)
    for ax, panel in zip(axes, panels):
        for i, (key, label) in enumerate(panel):
            points = [(a, r[key]) for a, r in zip(x, arms) if r[key] is not None]
            if points:
                ax.plot(*zip(*points), "o-", color=f"C{i}", label=label)
            for j, base in enumerate(untrained.values()):
                if key.startswith("val_") and base[key] is not None:
                    ax.axhline(base[key], color=f"C{i}", ls=("--", ":")[j % 2], lw=1,
                               label=f"{label}, untrained" + ("" if by_crop else f" ({base['activation']})"))
            if not points:
                ax.text(0.5, 0.5, "not measured (no GPU)", ha="center", transform=ax.transAxes)
        ax.set(xlabel="training crop (tokens)" if by_crop else "triangle attention activation",
               ylabel=" / ".join(label for _, label in panel))
        if by_crop:
            ax.set_xticks(x)
        else:
            ax.set_xticks(x, [r["activation"] for r in arms])
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def check_same_validation(results: list[dict]) -> None:
    """Every arm must have validated the same entries with the same tokens."""
    first = results[0]["row"]
    for r in results[1:]:
        if (r["row"]["val_entries"], r["row"]["val_tokens"]) != (first["val_entries"], first["val_tokens"]):
            raise SystemExit(f"{r['row']['run_dir']} validated {r['row']['val_entries']} ({r['row']['val_tokens']} "
                             f"tokens), {first['run_dir']} {first['val_entries']} ({first['val_tokens']}): the "
                             f"arms do not compare")


def check_plan(folder: Path, plan: dict) -> None:
    """Write the ablation folder's ``plan.json``, or check that it holds the same config, overrides and budget (an
    arm trained under another plan would not compare); arms may be added."""
    path = folder / "plan.json"
    if path.is_file():
        before = json.loads(path.read_text())
        if before != plan:
            changed = sorted(k for k in plan if before.get(k) != plan[k])
            raise SystemExit(f"{folder} holds an ablation with another {', '.join(changed)} ({path}); use another "
                             f"--tag or trainer.out_dir, or remove the folder")
    else:
        write_json(plan, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mini_of3.ablate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["crops"], help="the ablation (crops; --activation varies the activation)")
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG, help="a training config")
    parser.add_argument("--crops", default="256,384,512,768", help="comma-separated training crops (tokens)")
    parser.add_argument("--minutes", type=float, default=None, help="minutes of training steps per arm")
    parser.add_argument("--steps", type=int, default=None, help="training steps per arm")
    parser.add_argument("--activation", default=None, help="comma-separated triangle attention activations to "
                        "ablate at the first crop (softmax, sigmoid)")
    parser.add_argument("--val-crop", type=int, default=768, help="validation crop of every arm (tokens)")
    parser.add_argument("--out", default="benchmarks/results", help="folder of the JSON and PNG")
    parser.add_argument("--tag", default="", help="suffix of the ablation folder and result file names")
    args, extra = parser.parse_known_args(argv)
    config, user = config_argument(args.config, extra, DEFAULT_CONFIG, OPTIONS)
    crops = parse_list(args.crops, "--crops", crop_size, "crop sizes (integers >= 1)")
    activations = None if args.activation is None else \
        parse_list(args.activation, "--activation", activation, f"activations ({', '.join(ACTIVATIONS)})")
    if args.val_crop < 1:
        raise SystemExit(f"--val-crop must be >= 1, got {args.val_crop}")
    budget = budget_overrides(args.minutes, args.steps)
    kind = "crops" if activations is None else "activation"
    stem = f"ablation_{kind}{('_' + args.tag) if args.tag else ''}"

    folder_keys = [o for o in user if o.partition("=")[0].strip() == "trainer.out_dir"]
    user = [o for o in user if o not in folder_keys]                      # names the ablation folder, not a run
    folder = Path(folder_keys[-1].partition("=")[2] if folder_keys else f"runs/ablate_{kind}"
                  + (f"_{args.tag}" if args.tag else ""))
    fixed = {"data.val_crop_size": args.val_crop, "trainer.resume": "auto", **budget}
    per_arm = ["data.crop_size", *(["model.tri_attn_activation"] if activations is not None else [])]
    common = command_overrides(user, {}, fixed, f"the ablation itself ({OPTIONS})", reserved=per_arm)
    cfg, prepared = prepare_once(load(config, common))
    from mini_of3.data import read_manifest, select_entries
    val_ids = [r.id for r in select_entries(read_manifest(prepared), cfg.data, "val")]
    if not val_ids:
        raise SystemExit(f"{prepared}: no validation entries (data.val_ids={cfg.data.val_ids}, data.val_after="
                         f"{cfg.data.val_after}); the arms must validate on the same entries")
    arms = plan_arms(crops, activations, cfg.model.tri_attn_activation)
    check_plan(folder, {"config": config, "overrides": common, "val_crop": args.val_crop, "budget": budget})

    results = []
    for i, arm in enumerate(arms, start=1):
        done = folder / arm.name / "arm.json"
        if done.is_file():
            say(f"arm {i}/{len(arms)} {arm.name}: finished before ({done}), skipped")
            results.append(json.loads(done.read_text()))
            continue
        say(f"arm {i}/{len(arms)} {arm.name}: training in {folder / arm.name}, validating {', '.join(val_ids)} "
            f"at crop {args.val_crop}")
        results.append(run_arm(arm, config, [*common, *arm_overrides(arm, folder)], prepared))
        row = results[-1]["row"]
        say(f"arm {i}/{len(arms)} {arm.name}: {row['steps']} steps in {row['train_minutes']:.1f} min, median step "
            f"{row['step_s']:.3f} s, validation lDDT-Ca {row['val_lddt_ca']}")
    check_same_validation(results)

    result = result_header("ablation", prog="python -m mini_of3.ablate")
    firsts: dict[str, dict] = {}                                         # the first arm's of each model
    for r in results:
        firsts.setdefault(r["untrained"]["activation"], r["untrained"])
    result.update(config=config, overrides=common, val_crop=args.val_crop, val_ids=val_ids, folder=str(folder),
                  budget={"minutes": args.minutes, "steps": args.steps}, arms=[asdict(a) for a in arms])
    result["rows"] = [*firsts.values(), *(r["row"] for r in results)]
    out = Path(args.out)
    write_json(result, out / f"{stem}.json")
    plot(result["rows"], out / f"{stem}.png", f"{kind} ablation ({config}, validation crop {args.val_crop})")
    print()
    print_table(result["rows"], [("impl", "impl", "s"), ("N", "crop", "d"), ("activation", "activation", "s"),
                                 ("steps", "steps", "d"), ("step_s", "step s", ".3f"), ("peak_mib", "peak MiB", ".0f"),
                                 ("val_lddt_ca", "lDDT-Ca", ".3f"), ("val_contact_precision", "contacts", ".3f"),
                                 ("val_distogram_loss", "disto loss", ".3f")])
    print(f"\nwrote {out / (stem + '.json')} and {out / (stem + '.png')}")


if __name__ == "__main__":
    main()
