"""Summarise a training run folder (log.jsonl, config.yaml) as a result JSON for ``benchmarks/results/`` (DESIGN.md
schema: bench, device, versions, commit, command, rows) and print a short table.

    python benchmarks/train_summary.py RUN_DIR --command "..." [--device "NVIDIA H200"] [--commit abc1234]
        [--torch 2.11.0] [--triton 3.6.0] [--note "..."] [--out benchmarks/results/train_crop384_<commit>.json]

The steady step time is the median over the last three quarters of the steps (the first ones include Triton
compilation and autotuning); the loss change compares the mean of the first and last tenth of the steps.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import yaml


def summarise(rows: list[dict], config: dict) -> dict:
    """One result row from the JSONL rows of a run and its saved config."""
    train = [r for r in rows if r.get("split") == "train"]
    if not train:
        raise SystemExit("no training steps in the log")
    tenth = max(1, len(train) // 10)
    mean = lambda key, part: statistics.mean(r[key] for r in part)  # noqa: E731
    crop = config.get("data", {}).get("crop_size")
    return {
        "impl": config.get("model", {}).get("tri_attn_backend", "auto"), "config": f"crop{crop}", "N": crop,
        "steps": len(train), "step_s": statistics.median(r["step_s"] for r in train[len(train) // 4:]),
        "first_step_s": train[0]["step_s"], "peak_gib": max(r.get("peak_mem_gib", 0.0) for r in train),
        "loss_first": mean("loss", train[:tenth]), "loss_last": mean("loss", train[-tenth:]),
        "distogram_first": mean("distogram", train[:tenth]), "distogram_last": mean("distogram", train[-tenth:]),
        "skipped_steps": sum(bool(r.get("skipped")) for r in train),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--command", required=True)
    parser.add_argument("--device", default="")
    parser.add_argument("--commit", default="")
    parser.add_argument("--torch", default="")
    parser.add_argument("--triton", default="")
    parser.add_argument("--note", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = [json.loads(line) for line in (args.run_dir / "log.jsonl").read_text().splitlines() if line.strip()]
    config = yaml.safe_load((args.run_dir / "config.yaml").read_text())
    row = summarise(rows, config)
    validation = [r for r in rows if r.get("split") == "val"]
    print(f"{row['config']}: {row['steps']} steps, median step {row['step_s']:.3f} s (first {row['first_step_s']:.1f} s), "
          f"peak {row['peak_gib']:.1f} GiB, loss {row['loss_first']:.2f} -> {row['loss_last']:.2f}, "
          f"distogram {row['distogram_first']:.2f} -> {row['distogram_last']:.2f}")
    for r in validation:
        print(f"  val step {r['step']:>5}: lDDT-Ca {r['lddt_ca']:.3f}  TM {r['tm_score']:.3f}  RMSD {r['rmsd']:.1f} A  "
              f"distogram acc {r['distogram_accuracy']:.3f}  loss {r['loss']:.3f}")
    if args.out:
        result = {"bench": "train", "device": args.device, "torch": args.torch, "triton": args.triton,
                  "commit": args.commit, "command": args.command, "note": args.note, "versions": {},
                  "rows": [row], "validation": validation, "log": [r for r in rows if r.get("split") == "train"]}
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
