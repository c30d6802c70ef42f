"""What the commands that train share (``python -m mini_of3.bench fit``, ``python -m mini_of3.ablate``): the CONFIG
argument with its ``key=value`` overrides, the overrides a command sets itself, the data prepared once, the real
trainer run with its errors as one line, and the validation rows of its log.jsonl. Each raises SystemExit with one
clear line on bad input.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path

from mini_of3.config import Config, ConfigError, load_config


def config_argument(config: str, extra: list[str], default: str, options: str) -> tuple[str, list[str]]:
    """(config file, overrides) from a command's optional CONFIG argument and the arguments argparse left over:
    a CONFIG holding ``=`` is an override (the default file is used); anything left that is not ``key=value`` is an
    error naming the command's ``options``."""
    if "=" in config:
        config, extra = default, [config, *extra]
    bad = [o for o in extra if "=" not in o]
    if bad:
        raise SystemExit(f"unexpected argument {bad[0]!r} (options are {options}; overrides are key=value)")
    if not Path(config).is_file():
        raise SystemExit(f"config {config!r} not found")
    return config, list(extra)


def command_overrides(user: list[str], defaults: Mapping[str, object], fixed: Mapping[str, object],
                      who: str, reserved: Iterable[str] = ()) -> list[str]:
    """``defaults`` the user may change, then the user's overrides, then what the command ``fixed`` (``who``, e.g.
    "the fit command (--ids, --steps)", sets those: the user may not, nor the ``reserved`` keys that the command
    sets elsewhere, e.g. per run)."""
    keys = {item.partition("=")[0].strip() for item in user}
    clash = sorted(keys & {*fixed, *reserved})
    if clash:
        raise SystemExit(f"{clash[0]}: set by {who}; leave it out of the overrides")
    return [f"{k}={v}" for k, v in defaults.items() if k not in keys] + list(user) + \
        [f"{k}={v}" for k, v in fixed.items()]


def load(config: str, overrides: list[str]) -> Config:
    try:
        return load_config(config, overrides)
    except ConfigError as err:
        raise SystemExit(f"config: {err}") from None


def prepare_once(cfg: Config) -> tuple[Config, Path]:
    """(``cfg`` reading the prepared folder directly, that folder): ``data.root`` prepared into ``data.cache_dir``
    once, so that several runs do not each check it again."""
    from mini_of3.data import prepare_data
    try:
        prepared = prepare_data(cfg.data, progress=True)
    except (OSError, ValueError, RuntimeError) as err:
        raise SystemExit(f"data.root={cfg.data.root}: {err}") from None
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, root=str(prepared))), prepared


def run_trainer(cfg: Config):
    """``Trainer(cfg).fit()`` (:class:`mini_of3.trainer.TrainResult`), its errors as one line."""
    from mini_of3.trainer import Trainer, TrainingError
    try:
        return Trainer(cfg).fit()
    except (TrainingError, ConfigError) as err:
        raise SystemExit(str(err)) from None


def validation_rows(log_rows: Iterable[dict]) -> list[dict]:
    """The validation rows of a run's log (those with per-entry scores), by step."""
    return sorted((r for r in log_rows if r.get("split") == "val" and r.get("entries")), key=lambda r: r["step"])
