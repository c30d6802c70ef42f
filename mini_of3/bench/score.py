"""``python -m mini_of3.bench score RUN [--mmcif DIR] [--ids A,B | --max-tokens N] [--exclude C,D]``: how well a
trained run predicts whole entries, its training entries included.

The trainer validates on its validation entries only; this scores a checkpoint (RUN: a run folder, its latest
checkpoint, or with ``--best`` its best by validation lDDT; or one checkpoint folder; EMA weights, as ``predict``
uses) on any entries given as mmCIF files,
whole (every chain), each with ``--samples`` structures ranked by mean pLDDT. Per entry: the top-pLDDT sample's
lDDT-Calpha, TM-score, its mirror image's TM-score and mean pLDDT, and ``mirrored_fraction``, the share of all the
entry's samples whose mirror image scores the higher TM-score (a sample of the wrong hand: lDDT cannot see it).

    python -m mini_of3.bench score runs/crop384 --mmcif data/mmcif --max-tokens 384 --exclude 1AKI,3O5R

Writes ``<out>/score[_tag].json`` (``"bench": "score"``, one row per entry: ``entry``, ``N``, ``step``,
``lddt_ca``, ``tm_score``, ``tm_score_mirror``, ``rmsd``, ``plddt``, ``mirrored_fraction``) and prints a table with
the means last.
"""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from mini_of3.bench.common import print_table, result_header, write_json
from mini_of3.data import MmcifError
from mini_of3.data.prepare import MMCIF_SUFFIXES
from mini_of3.predict import load_model, read_query, sample_ranked

METRICS = ("lddt_ca", "tm_score", "tm_score_mirror", "rmsd", "plddt", "mirrored_fraction")


def entry_id(path: Path) -> str:
    """``1abc.cif.gz`` -> ``1ABC``."""
    return path.name.split(".")[0].upper()


def find_entries(folder: Path, ids: list[str] | None, exclude: set[str]) -> list[Path]:
    """The mmCIF files of ``folder`` (any depth) named by ``ids`` (all of them when None), less ``exclude``; a named
    id without a file is an error."""
    files = {entry_id(p): p for p in sorted(folder.rglob("*")) if p.name.lower().endswith(MMCIF_SUFFIXES)}
    if ids is None:
        return [p for i, p in sorted(files.items()) if i not in exclude]
    missing = [i for i in ids if i not in files]
    if missing:
        raise SystemExit(f"{folder}: no mmCIF file for {', '.join(missing)}")
    return [files[i] for i in ids if i not in exclude]


def score_entry(model, query, device: torch.device, *, steps: int, samples: int, seed: int) -> dict:
    """The top-pLDDT sample's scores and the share of mirrored samples of one entry."""
    _, _, rows = sample_ranked(model, query, device, recycles=model.cfg.n_recycles, steps=steps, samples=samples,
                               seed=seed)
    top = rows[0]
    mirrored = sum(r["tm_score_mirror"] > r["tm_score"] for r in rows) / len(rows)
    return {"entry": query.name.upper(), "N": len(query.features["restype"]),
            **{k: float(top[k]) for k in METRICS if k in top}, "mirrored_fraction": mirrored}


def run_folder(checkpoint: Path) -> Path:
    """The run folder of a checkpoint folder (``<run>/checkpoints/step_<N>``)."""
    return checkpoint.parent.parent


def _ids(text: str | None) -> list[str] | None:
    return None if text is None else [i.strip().upper() for i in text.split(",") if i.strip()]


def add_sampling_options(parser: argparse.ArgumentParser, samples: int, samples_help: str | None = None) -> None:
    """The options of a command that samples a checkpoint's structures of mmCIF entries (this one, ``bench
    conditioning``): --mmcif, --ids, --samples, --steps, --seed, --device, --out, --tag."""
    parser.add_argument("--mmcif", default="data/mmcif", help="a folder of mmCIF files (the truth)")
    parser.add_argument("--ids", default=None, help="comma-separated entries (default: every file in --mmcif)")
    parser.add_argument("--samples", type=int, default=samples, help=samples_help)
    parser.add_argument("--steps", type=int, default=None, help="EDM steps (default: the model's sampling_steps)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", default=None, help="folder of the JSON (default: the checkpoint's run folder)")
    parser.add_argument("--tag", default="")


def sampling_device(args: argparse.Namespace) -> torch.device:
    """--device, else CUDA where there is one."""
    return torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mini_of3.bench score", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a run folder (its latest checkpoint, or its best with --best) or a checkpoint "
                        "folder")
    parser.add_argument("--best", action="store_true", help="a run folder's best checkpoint by validation lDDT")
    parser.add_argument("--exclude", default="", help="comma-separated entries left out (e.g. the validation ones)")
    parser.add_argument("--max-tokens", type=int, default=None, help="only entries of at most this many tokens")
    add_sampling_options(parser, samples=5)
    args = parser.parse_args(argv)
    if args.samples < 1 or (args.steps is not None and args.steps < 1):
        raise SystemExit(f"--samples and --steps must be >= 1, got {args.samples}, {args.steps}")
    device = sampling_device(args)
    model, folder, state = load_model(args.run, device, prefer="best" if args.best else "latest")
    steps = args.steps or model.cfg.sampling_steps
    result = result_header("score")
    result.update({"checkpoint": str(folder), "step": state.get("step"), "samples": args.samples, "steps": steps})
    for path in find_entries(Path(args.mmcif), _ids(args.ids), set(_ids(args.exclude) or [])):
        try:
            query = read_query(path)
        except (MmcifError, ValueError) as err:            # an unusable file: one line, and on to the next
            print(f"skipped {path}: {err}", flush=True)
            continue
        if args.max_tokens is not None and len(query.features["restype"]) > args.max_tokens:
            continue
        row = {**score_entry(model, query, device, steps=steps, samples=args.samples, seed=args.seed),
               "step": state.get("step")}
        result["rows"].append(row)
        print(f"{row['entry']} ({row['N']} tokens): lDDT-Ca {row['lddt_ca']:.3f}, TM {row['tm_score']:.3f} "
              f"(mirror {row['tm_score_mirror']:.3f}), pLDDT {row['plddt']:.1f}, mirrored "
              f"{row['mirrored_fraction']:.2f}", flush=True)
    rows = result["rows"]
    if not rows:
        raise SystemExit("no entry to score (check --mmcif, --ids, --exclude and --max-tokens)")
    result["means"] = {k: statistics.mean(r[k] for r in rows) for k in METRICS}
    out = Path(args.out) if args.out else run_folder(folder)
    name = f"score{('_' + args.tag) if args.tag else ''}.json"
    write_json(result, out / name)
    print_table(rows + [{"entry": "mean", "N": None, **result["means"]}],
                [("entry", "entry", "s"), ("N", "tokens", "d"), ("lddt_ca", "lDDT-Ca", ".3f"),
                 ("tm_score", "TM", ".3f"), ("tm_score_mirror", "TM mirror", ".3f"), ("plddt", "pLDDT", ".1f"),
                 ("mirrored_fraction", "mirrored", ".2f")])
    print(f"\ncheckpoint {folder} (step {state.get('step')}); wrote {out / name}")


if __name__ == "__main__":
    main()
