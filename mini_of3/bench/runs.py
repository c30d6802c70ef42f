"""``python -m mini_of3.bench runs RUN_DIR [RUN_DIR ...]``: training runs as benchmark results.

One run folder (its ``log.jsonl`` and ``config.yaml``): steps, the steady step time (median over the last three
quarters of the steps: the first ones include Triton compilation and autotuning), samples per second (the global
batch is the number of entries a step logs in ``ids``, gathered from every rank), peak memory (main process), and the
loss of the first and last tenth of the steps. Several folders: each later run is also compared with the first, the
reference, step by step (e.g. 2 GPUs against 1 GPU with the same global batch): the speed-up in samples per
second, whether every step saw the same entries, and the largest relative difference of the training loss; with
``--plot`` the loss curves and their relative difference are drawn.

    python -m mini_of3.bench runs runs/gpu1 runs/gpu2 --command "..." --out benchmarks/results/x.json --plot x.png
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import yaml

from mini_of3.bench.common import result_header, write_json
from mini_of3.training.runlog import LOG_FILE, read_log


def load_run(run_dir: Path) -> tuple[list[dict], dict]:
    """(the JSONL rows, the saved config) of a run folder."""
    log = run_dir / LOG_FILE
    if not log.is_file():
        raise SystemExit(f"{run_dir}: no {LOG_FILE} (did the run start?)")
    rows = read_log(log)
    config_path = run_dir / "config.yaml"
    config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}
    return rows, config


def train_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("split") == "train"]


def summarise(rows: list[dict], config: dict, name: str = "") -> dict:
    """One result row for a run: speed, memory and the loss change."""
    train = train_rows(rows)
    if not train:
        raise SystemExit(f"{name or 'run'}: no training steps in the log")
    tenth = max(1, len(train) // 10)
    crop = config.get("data", {}).get("crop_size")
    step_s = statistics.median(r["step_s"] for r in train[len(train) // 4:])
    global_batch = len(train[-1].get("ids", [])) or 1

    def mean(key: str, part: list[dict]) -> float:
        return statistics.mean(r[key] for r in part)
    return {
        "run": name, "impl": config.get("model", {}).get("tri_attn_backend", "auto"), "config": f"crop{crop}",
        "N": crop, "n_blocks": config.get("model", {}).get("n_blocks"), "steps": len(train),
        "global_batch": global_batch, "grad_accum": config.get("trainer", {}).get("grad_accum"),
        "step_s": step_s, "first_step_s": train[0]["step_s"], "samples_per_s": global_batch / step_s,
        "peak_gib": max(r.get("peak_mem_gib", 0.0) for r in train),
        "loss_first": mean("loss", train[:tenth]), "loss_last": mean("loss", train[-tenth:]),
        "distogram_first": mean("distogram", train[:tenth]), "distogram_last": mean("distogram", train[-tenth:]),
        "skipped_steps": sum(bool(r.get("skipped")) for r in train),
    }


def compare(reference: list[dict], other: list[dict], ref_row: dict, other_row: dict) -> dict:
    """How ``other`` differs from ``reference``, step by step over the steps both have."""
    by_step = {r["step"]: r for r in train_rows(reference)}
    pairs = [(by_step[r["step"]], r) for r in train_rows(other) if r["step"] in by_step]
    rel = [abs(b["loss"] - a["loss"]) / max(abs(a["loss"]), 1e-12) for a, b in pairs]
    return {
        "reference": ref_row["run"], "steps_compared": len(pairs),
        "speedup_samples_per_s": other_row["samples_per_s"] / ref_row["samples_per_s"],
        "same_entries_every_step": all(a.get("ids") == b.get("ids") for a, b in pairs),
        "loss_max_rel_diff": max(rel, default=float("nan")),
        "loss_median_rel_diff": statistics.median(rel) if rel else float("nan"),
        "peak_ratio": other_row["peak_gib"] / ref_row["peak_gib"] if ref_row["peak_gib"] else float("nan"),
    }


def plot(runs: list[tuple[str, list[dict]]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2 if len(runs) > 1 else 1, figsize=(11 if len(runs) > 1 else 6, 4), squeeze=False)
    for name, rows in runs:
        train = train_rows(rows)
        axes[0][0].plot([r["step"] for r in train], [r["loss"] for r in train], label=name, lw=1.2)
    axes[0][0].set_xlabel("step")
    axes[0][0].set_ylabel("training loss")
    axes[0][0].legend()
    axes[0][0].grid(alpha=0.3)
    if len(runs) > 1:
        ref = {r["step"]: r["loss"] for r in train_rows(runs[0][1])}
        for name, rows in runs[1:]:
            pts = [(r["step"], max(abs(r["loss"] - ref[r["step"]]) / abs(ref[r["step"]]), 1e-12))   # 0 on a log axis
                   for r in train_rows(rows) if r["step"] in ref]
            if pts:
                axes[0][1].plot(*zip(*pts), label=f"{name} vs {runs[0][0]}", lw=1.2)
        axes[0][1].set_yscale("log")
        axes[0][1].set_xlabel("step")
        axes[0][1].set_ylabel("|loss - reference| / reference")
        axes[0][1].legend()
        axes[0][1].grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mini_of3.bench runs", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", type=Path, nargs="+", help="run folders; the first is the reference")
    parser.add_argument("--names", default="", help="comma-separated names (default: the folder names)")
    parser.add_argument("--note", default="")
    parser.add_argument("--command", default="", help="the command that made the runs (default: this one)")
    for key in ("device", "commit", "torch", "triton"):   # when summarising elsewhere than where the runs ran
        parser.add_argument(f"--{key}", default="", help=f"the runs' {key} (default: this machine's)")
    parser.add_argument("--out", type=Path, help="result JSON")
    parser.add_argument("--plot", type=Path, help="PNG of the loss curves")
    args = parser.parse_args(argv)
    names = args.names.split(",") if args.names else [d.name for d in args.run_dirs]
    if len(names) != len(args.run_dirs):
        raise SystemExit(f"--names gives {len(names)} names for {len(args.run_dirs)} runs")
    runs = [(name, *load_run(d)) for name, d in zip(names, args.run_dirs)]
    result = result_header("runs", {})
    result.update({key: getattr(args, key) for key in ("command", "device", "commit", "torch", "triton")
                   if getattr(args, key)})
    result["note"] = args.note
    for name, rows, config in runs:
        row = summarise(rows, config, name)
        if result["rows"]:
            row["vs_reference"] = compare(runs[0][1], rows, result["rows"][0], row)
        result["rows"].append(row)
        print(f"{name}: {row['config']}, {row['steps']} steps, global batch {row['global_batch']}: median step "
              f"{row['step_s']:.3f} s (first {row['first_step_s']:.1f} s), {row['samples_per_s']:.2f} samples/s, "
              f"peak {row['peak_gib']:.1f} GiB, loss {row['loss_first']:.2f} -> {row['loss_last']:.2f}")
        if "vs_reference" in row:
            c = row["vs_reference"]
            print(f"  vs {c['reference']}: {c['speedup_samples_per_s']:.2f}x samples/s, same entries every step: "
                  f"{c['same_entries_every_step']}, loss rel. diff max {c['loss_max_rel_diff']:.1e} (median "
                  f"{c['loss_median_rel_diff']:.1e}) over {c['steps_compared']} steps, peak x{c['peak_ratio']:.2f}")
        for r in (r for r in rows if r.get("split") == "val"):
            print(f"  val step {r['step']:>5}: lDDT-Ca {r['lddt_ca']:.3f}  TM {r['tm_score']:.3f}  "
                  f"RMSD {r['rmsd']:.1f} A  distogram acc {r['distogram_accuracy']:.3f}  loss {r['loss']:.3f}")
    result["validation"] = {name: [r for r in rows if r.get("split") == "val"] for name, rows, _ in runs}
    result["log"] = {name: train_rows(rows) for name, rows, _ in runs}
    if args.out:
        write_json(result, args.out)
        print(f"wrote {args.out}")
    if args.plot:
        plot([(name, rows) for name, rows, _ in runs], args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
