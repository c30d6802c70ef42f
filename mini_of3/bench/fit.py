"""``python -m mini_of3.bench fit [CONFIG] --ids A,B,C --steps S``: can the model fit the entries it trains on?

The real trainer (:class:`mini_of3.trainer.Trainer`) trains on the named entries only (``data.train_ids``) and
validates on the same entries (``data.val_ids``), on purpose: the removal of training entries homologous to
validation ones is switched off for this command (``data.val_identity_cut=null``), as every training entry is its own
validation entry. Validation runs the trainer's own path (EMA weights, sampled structures, the top-pLDDT sample
scored) at step 0 (the untrained model, same seed), every ``--every`` steps and at the end; each entry's lDDT-Calpha
(blind to a mirror image), TM-score (not blind to it; tm_score_mirror, the TM-score of the sample's mirror image,
above tm_score says the sample has the wrong hand) and mean pLDDT are read back from the run's log.jsonl.

    python -m mini_of3.bench fit configs/crop384.yaml --ids 1EMA,1GBT,4I39,3NZD --steps 2000 --every 200

Writes ``<out>/fit[_tag].json`` (one row per entry and validation step) and ``.png`` (lDDT-Calpha, TM-score and
pLDDT per entry against step, the untrained model's as a dashed line); the run folder (checkpoints, log.jsonl,
config.yaml) is ``runs/<name>`` unless ``trainer.out_dir=...`` says otherwise.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from mini_of3.bench.common import print_table, result_header, write_json
from mini_of3.bench.trainrun import (command_overrides, config_argument, load, prepare_once, run_trainer,
                                     validation_rows)

DEFAULT_CONFIG = "configs/default.yaml"
DEFAULT_IDS = "1EMA,1GBT,4I39,3NZD"
METRICS = ("lddt_ca", "tm_score", "tm_score_mirror", "rmsd")   # per entry, trained and untrained (mean_plddt: plddt)


# ---------------------------------------------------------------------------------------------------------------
# arguments


def parse_ids(text: str) -> list[str]:
    """``A,B,C`` -> the entry ids (upper case, in order), or one clear error line."""
    ids = [i.strip().upper() for i in text.split(",") if i.strip()]
    if not ids:
        raise SystemExit(f"--ids: expected comma-separated entry ids, got {text!r}")
    if len(set(ids)) != len(ids):
        raise SystemExit(f"--ids: {text!r} names an entry twice")
    return ids


def fit_overrides(ids: list[str], steps: int, every: int, data: str | None, name: str,
                  user: list[str]) -> list[str]:
    """The ``key=value`` overrides of a fit run: defaults the user may change (run folder, fresh run, checkpoint at
    the end), the user's, then what the command fixes (train = validation = ``ids``, no homology filter, steps)."""
    defaults = {"trainer.out_dir": f"runs/{name}", "trainer.resume": "never", "trainer.checkpoint_every": steps}
    listed = "[" + ",".join(ids) + "]"
    fixed = {"data.train_ids": listed, "data.val_ids": listed, "data.val_after": "null",
             "data.val_identity_cut": "null",            # train = validation on purpose: no homologue removal
             "trainer.max_steps": steps, "trainer.val_every": every}
    if data:
        fixed.update({"data.root": data, "data.cache_dir": data})
    return command_overrides(user, defaults, fixed, "the fit command itself (--ids, --steps, --every, --data)")


def check_entries(prepared: Path, ids: list[str], data_cfg) -> None:
    """Every id must be a prepared entry that passes the data filters; else one clear error line."""
    from mini_of3.data.dataset import filter_reason, is_named
    from mini_of3.data.manifest import read_manifest

    rows = read_manifest(prepared)
    for entry in ids:
        row = next((r for r in rows if is_named(r, [entry])), None)
        if row is None:
            raise SystemExit(f"--ids: {entry} is not in {prepared / 'manifest.tsv'} ({len(rows)} entries)")
        reason = filter_reason(row, data_cfg)
        if reason is not None:
            raise SystemExit(f"--ids: {entry} does not pass the data filters ({reason})")


# ---------------------------------------------------------------------------------------------------------------
# the result


def fit_rows(log_rows: list[dict], impl: str) -> list[dict]:
    """One row per entry and validation step from a run's log rows; the step-0 (untrained) scores beside each."""
    val = validation_rows(log_rows)
    if not val or val[0]["step"] != 0:
        raise SystemExit("the run's log.jsonl has no step-0 validation (the untrained model) to compare with")
    untrained = {e["id"]: e for e in val[0]["entries"]}
    rows = []
    for v in val:
        for e in v["entries"]:
            base = untrained.get(e["id"], {})
            row = {"impl": impl, "entry": e["id"], "split": "train", "step": v["step"]}
            for key in METRICS:
                row[key], row[f"{key}_untrained"] = e.get(key), base.get(key)
            row["plddt"], row["plddt_untrained"] = e.get("mean_plddt"), base.get("mean_plddt")
            rows.append(row)
    return rows


def plot(rows: list[dict], path: Path, title: str) -> None:
    """lDDT-Calpha, TM-score and mean pLDDT per entry against step; each entry's untrained value dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = (("lddt_ca", "lDDT-Calpha", 1.0), ("tm_score", "TM-score", 1.0), ("plddt", "mean pLDDT", 100.0))
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.4))
    for ax, (key, label, top) in zip(axes, panels):
        for i, entry in enumerate(dict.fromkeys(r["entry"] for r in rows)):
            mine = [r for r in rows if r["entry"] == entry and r[key] is not None]
            if not mine:
                continue
            ax.plot([r["step"] for r in mine], [r[key] for r in mine], "o-", color=f"C{i}", ms=3, label=entry)
            if mine[0][f"{key}_untrained"] is not None:
                ax.axhline(mine[0][f"{key}_untrained"], color=f"C{i}", ls="--", lw=1)
        ax.set(xlabel="step", ylabel=label, ylim=(0, top), title=f"{label} (dashed: untrained)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(run_dir: Path, name: str, config: str, ids: list[str], steps: int | None, every: int | None, out: Path,
           tag: str) -> None:
    """Write ``<out>/fit[_tag].json`` and ``.png`` from a fit run's log.jsonl and print the table."""
    from mini_of3.training.runlog import read_log
    result = result_header("fit")
    result.update(config=config, ids=ids, steps=steps, every=every, run_dir=str(run_dir))
    result["rows"] = fit_rows(read_log(run_dir / "log.jsonl"), name)
    stem = f"fit{('_' + tag) if tag else ''}"
    write_json(result, out / f"{stem}.json")
    plot(result["rows"], out / f"{stem}.png", f"{name}: fit to the training entries ({config})")
    print()
    print_table(result["rows"], [("entry", "entry", "s"), ("step", "step", "d"), ("lddt_ca", "lDDT-Ca", ".3f"),
                                 ("lddt_ca_untrained", "untrained", ".3f"), ("tm_score", "TM", ".3f"),
                                 ("tm_score_untrained", "untrained", ".3f"), ("tm_score_mirror", "TM mirror", ".3f"),
                                 ("rmsd", "RMSD A", ".2f"),
                                 ("plddt", "pLDDT", ".1f")])
    print(f"\nwrote {out / (stem + '.json')} and {out / (stem + '.png')}")


def report_run(run_dir: Path, args) -> None:
    """``--report RUN_DIR``: the result of a fit run already on disk (the run's own ids, steps and validation
    interval from its config.yaml)."""
    if not (run_dir / "log.jsonl").is_file() or not (run_dir / "config.yaml").is_file():
        raise SystemExit(f"--report {run_dir}: not a run folder (no log.jsonl and config.yaml)")
    ran = load(str(run_dir / "config.yaml"), [])
    report(run_dir, args.name or run_dir.name, args.config, list(ran.data.train_ids), ran.trainer.max_steps,
           ran.trainer.val_every, Path(args.out or run_dir), args.tag)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mini_of3.bench fit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG, help="a training config")
    parser.add_argument("--ids", default=DEFAULT_IDS, help="comma-separated entries to train and validate on")
    parser.add_argument("--steps", type=int, default=1000, help="training steps")
    parser.add_argument("--every", type=int, default=None, help="validate every K steps (default: steps / 10)")
    parser.add_argument("--data", default=None, help="a prepared folder (default: the config's data.root, "
                        "prepared into data.cache_dir)")
    parser.add_argument("--name", default=None, help="the run's name: impl in the rows (default fit<number of ids>)")
    parser.add_argument("--out", default=None, help="folder of the JSON and PNG (default: the run folder)")
    parser.add_argument("--tag", default="", help="suffix of the result file names")
    parser.add_argument("--report", default=None, metavar="RUN_DIR",
                        help="train nothing: write the result of an existing fit run (one stopped early too) from its "
                             "log.jsonl and config.yaml")
    args, overrides = parser.parse_known_args(argv)   # key=value overrides of the config, as for train.py
    if args.report:
        report_run(Path(args.report), args)
        return
    args.config, overrides = config_argument(args.config, overrides, DEFAULT_CONFIG,
                                             "--ids, --steps, --every, --data, --name, --out, --tag")
    ids = parse_ids(args.ids)
    every = args.every if args.every is not None else max(1, args.steps // 10)
    if args.steps < 1 or every < 1:
        raise SystemExit(f"--steps and --every must be >= 1, got {args.steps}, {every}")
    if args.data and not (Path(args.data) / "manifest.tsv").is_file():
        raise SystemExit(f"--data {args.data}: no manifest.tsv (prepare the data first: python -m "
                         f"mini_of3.data.prepare SRC {args.data})")
    name = args.name or f"fit{len(ids)}"
    cfg = load(args.config, fit_overrides(ids, args.steps, every, args.data, name, overrides))

    cfg, prepared = prepare_once(cfg)
    check_entries(prepared, ids, cfg.data)
    done = run_trainer(cfg)

    report(done.out_dir, name, args.config, ids, args.steps, every, Path(args.out or done.out_dir), args.tag)

if __name__ == "__main__":
    main()
