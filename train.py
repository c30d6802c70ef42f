"""Train mini_of3:  accelerate launch train.py [configs/X.yaml] [key=value ...]

Without a config file the embedded default runs (configs/default.yaml): a small model on the offline package's
entries that trains on a CPU in a few minutes. Any key of mini_of3/config.py can be set on the command line, e.g.
    accelerate launch train.py configs/crop384.yaml trainer.max_steps=300 wandb=false
Resume: trainer.resume=auto (the default) continues from the run folder's latest checkpoint.
"""
import os
import sys
from pathlib import Path

from mini_of3.config import ConfigError, load_config

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "default.yaml"


def parse_args(argv: list[str]) -> tuple[Path, list[str]]:
    """(config file, key=value overrides): an optional first argument without '=' names the config file."""
    path, overrides = DEFAULT_CONFIG, []
    for i, arg in enumerate(argv):
        if "=" in arg:
            overrides.append(arg)
        elif i == 0:
            path = Path(arg)
        else:
            raise ConfigError(f"argument {arg!r}: expected key=value (only the first argument may be a config file)")
    return path, overrides


def error(message: str) -> None:
    """One line on stderr, from the first process only (every rank of a launch sees the same bad config)."""
    if os.environ.get("RANK", "0") == "0":
        print(f"train.py: {message}", file=sys.stderr)


def main(argv: list[str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    try:
        cfg = load_config(*parse_args(argv))
    except ConfigError as err:
        error(f"config error: {err}")
        return 2
    from mini_of3.trainer import TrainingError, train          # torch, accelerate: after the config is known good

    try:
        result = train(cfg)
    except ConfigError as err:
        error(f"config error: {err}")
        return 2
    except TrainingError as err:
        error(str(err))
        return 1
    except KeyboardInterrupt:
        error(f"interrupted; the last complete checkpoint is in {cfg.trainer.out_dir}/checkpoints")
        return 130
    return {"SIGINT": 130, "SIGTERM": 143}.get(result.stopped_by or "", 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
