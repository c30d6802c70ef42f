"""The record of one device call of the crop ablation (tools/lab/device_ablation.sh), for benchmarks/results/: per
run of the call (seed:arm), its arm.json summary when it finished, else how far its log got; the calibration; the
GPU's utilisation per minute. Run here after unpacking the call's ablation_arms.tgz into .device/ablation.

    python tools/lab/ablation_call_record.py .device/ablation/crops FILES_AT/gpu_util.csv --runs "0:crop256 0:crop384" \
        --card "NVIDIA H100 80GB HBM3" --commit c5a3c6c --command "..." --note "..." --out benchmarks/results/X.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from mini_of3.ablation.cost import WARMUP
from mini_of3.training.runlog import read_log


def run_row(folder: Path, seed: int, arm: str) -> dict:
    """One run of the call: the summary of its arm.json, or its progress when it did not finish."""
    run = folder / f"seed{seed}" / arm
    if (run / "arm.json").is_file():
        return {**json.loads((run / "arm.json").read_text())["summary"], "finished": True}
    if arm == "baselines":
        return {"arm": arm, "seed": seed, "finished": (folder / f"seed{seed}" / "baselines.json").is_file()}
    logs = [run / "start" / "log.jsonl", run / "log.jsonl"]
    train = [r for p in logs for r in read_log(p) if r.get("split") == "train"]
    times = [r["step_s"] for r in train][WARMUP:]
    return {"arm": arm, "seed": seed, "finished": False, "step": train[-1]["step"] if train else 0,
            "step_s": statistics.median(times) if times else None}


def utilisation(csv: Path) -> list[float]:
    """The mean utilisation per minute of nvidia-smi's samples (one every 5 s)."""
    util = [float(line.split(",")[1].strip(" %")) for line in csv.read_text().splitlines() if line.count(",") >= 2]
    return [round(statistics.fmean(util[i:i + 12]), 1) for i in range(0, len(util), 12)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("util", type=Path)
    parser.add_argument("--runs", required=True, help="the call's seed:arm pairs, space-separated")
    parser.add_argument("--card", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--command", required=True)
    parser.add_argument("--note", default="")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    pairs = [(int(r.split(":")[0]), r.split(":")[1]) for r in args.runs.split()]
    costs = args.folder / "step_costs.json"
    result = {"bench": "ablation_call", "device": args.card, "commit": args.commit, "command": args.command,
              "note": args.note, "step_costs": json.loads(costs.read_text()) if costs.is_file() else None,
              "gpu_util_percent_per_minute": utilisation(args.util) if args.util.is_file() else [],
              "rows": [run_row(args.folder, seed, arm) for seed, arm in pairs]}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for row in result["rows"]:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
