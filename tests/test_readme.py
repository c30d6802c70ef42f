"""The README is a user's guide whose commands run as written.

Commands are the lines of its ```bash blocks (``&&`` splits a line into commands) and the inline `python -m mini_of3
...` / `accelerate launch ...` commands of its text. Every ``python -m`` entry point answers ``--help`` with exit 0
and knows every ``--option`` the command gives it; every ``train.py`` command's config and ``key=value`` overrides
load; the files a command names exist. The cheap ones run for real: the set-up's training command (two steps of a
tiny model on a small prepared set) and the predict command on the run it leaves.
"""
from __future__ import annotations

import re
import runpy
import shlex
import sys
import warnings
from pathlib import Path

import pytest
import torch

from mini_of3.config import load_config
from trainer.conftest import small_data  # noqa: F401  (the fixture: a small prepared set and its validation id)
from trainer.helpers import describe, run_train, tiny_overrides

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TEST_COMMAND = 'pip install -e ".[dev]" && python -m pytest'
INLINE = re.compile(r"`((?:python -m mini_of3|accelerate launch)[^`]*)`")


def fenced_lines(text: str, language: str = "bash") -> list[str]:
    """The lines of the README's ``language`` code blocks, continuation lines joined, comments dropped."""
    lines, inside, pending = [], False, ""
    for line in text.splitlines():
        if line.startswith("```"):
            inside = line.strip() == f"```{language}"
            continue
        if not inside:
            continue
        line = pending + line
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1] + " "
            continue
        pending = ""
        line = re.sub(r"(^|\s)#.*$", "", line).strip()        # a comment: '#' at the start or after a space
        if line:
            lines.append(" ".join(line.split()))
    return lines


def readme_commands() -> list[str]:
    """Every command of the README, in order, once: fenced lines split at ``&&``, then the inline commands."""
    text = README.read_text()
    commands = [part.strip() for line in fenced_lines(text) for part in line.split("&&")]
    commands += [part.strip() for inline in INLINE.findall(text) for part in inline.split("&&")]
    return list(dict.fromkeys(commands))


def entry_point_commands() -> list[str]:
    return [c for c in readme_commands() if c.startswith("python -m mini_of3")]


def train_commands() -> list[str]:
    return [c for c in readme_commands() if c.startswith("accelerate launch")]


def test_the_readme_is_a_guide_of_at_most_300_lines_without_the_work_log():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    for pattern in (r"MINI_OF3_COMMIT", r"session [0-9]", r"issue [0-9]", r"\.\./shared", r"\brun [0-9]+\b"):
        assert not re.search(pattern, text, re.IGNORECASE), pattern


def test_ci_runs_the_readme_test_command_verbatim():
    assert TEST_COMMAND in fenced_lines(README.read_text())
    assert TEST_COMMAND in (REPO / ".ci" / "run").read_text().splitlines()


def test_the_readme_has_commands_of_every_kind():
    assert len(entry_point_commands()) >= 8 and len(train_commands()) >= 4
    assert "accelerate launch train.py" in train_commands()


@pytest.mark.parametrize("command", readme_commands())
def test_every_file_a_command_names_exists(command):
    words = shlex.split(command)
    named = [w for w in words if re.fullmatch(r"(configs/\S+\.yaml|data/\S+\.txt)", w)]
    named += [value for option, value in zip(words, words[1:]) if option == "--config_file"]
    missing = [path for path in named if not (REPO / path).is_file()]
    assert not missing, f"{command}: {missing}"


@pytest.mark.parametrize("command", entry_point_commands())
def test_every_entry_point_answers_help_and_knows_the_options_given(command, monkeypatch, capsys):
    """``python -m MODULE WORDS --help`` (the leading words pick a sub-command) exits 0 and lists every option."""
    words = shlex.split(command)[2:]
    module, args = words[0], words[1:]
    leading = [a for a in args[:next((i for i, a in enumerate(args) if a.startswith("-")), len(args))] if "=" not in a]
    monkeypatch.setattr(sys, "argv", [module, *leading, "--help"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)          # the module may be imported already
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as done:
            code = done.code or 0
    assert code == 0, f"{command}: --help exited {code}"
    shown = capsys.readouterr().out
    unknown = [o.split("=")[0] for o in args if o.startswith("--") and o.split("=")[0] not in shown]
    assert not unknown, f"{command}: {unknown} not in its --help"


@pytest.mark.parametrize("command", train_commands())
def test_every_training_command_has_a_config_and_overrides_that_load(command):
    sys.path.insert(0, str(REPO))
    try:
        import train
    finally:
        sys.path.remove(str(REPO))
    words = shlex.split(command)
    path, overrides = train.parse_args(words[words.index("train.py") + 1:])
    cfg = load_config(path if path.is_absolute() else REPO / path, overrides)
    assert cfg.model.n_blocks >= 1


def test_the_setup_training_command_and_the_predict_command_run(small_data, shared_mmcif, tmp_path):  # noqa: F811
    """``accelerate launch train.py`` (two steps of the tiny model on the small set), then the README's predict
    command on that run folder and the validation entry instead of ``runs/default`` and 5PTI."""
    prepared, val_id = small_data
    words = shlex.split(next(c for c in train_commands() if c == "accelerate launch train.py"))
    run = tmp_path / "run"
    overrides = tiny_overrides(prepared, run, val_id, trainer__max_steps=2, trainer__val_every=2,
                               trainer__checkpoint_every=2)
    done = run_train(overrides, launcher=[sys.executable, "-m", "accelerate.commands.launch", *words[2:-1]],
                     script=words[-1])
    assert done.returncode == 0, describe(done)
    assert (run / "checkpoints" / "step_2").is_dir()

    from mini_of3.predict import main as predict
    predict_words = shlex.split(next(c for c in entry_point_commands() if c.startswith("python -m mini_of3.predict")))
    args = [str(run), str(shared_mmcif / f"{val_id}.cif.gz"), *predict_words[5:], "--out", str(tmp_path / "pred")]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert predict(args) in (0, None)
    finally:
        torch.set_num_threads(threads)
    assert len(list((tmp_path / "pred").glob(f"{val_id}_rank*.cif"))) == int(args[args.index("--samples") + 1])
