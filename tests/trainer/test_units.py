"""The trainer's parts on their own: schedule, per-step draws, EMA, checkpoint folders, RNG states, log, watchdog,
plots."""
from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest
import torch

from mini_of3.config import OptimConfig
from mini_of3.training import checkpoint as ckpt
from mini_of3.training.compile_clock import compile_seconds
from mini_of3.training.ema import EMA
from mini_of3.training.optim import build_optimizer, lr_factor
from mini_of3.training.streams import derived_seed, recycles_for_step
from mini_of3.training.plots import plot_run
from mini_of3.training.runlog import RunLog, Watchdog, read_log


def test_lr_schedule_is_af3s_warmup_then_step_decay():
    cfg = OptimConfig()                                   # AF3 SI 5.4: 1000 warm-up steps, x0.95 every 50k
    assert lr_factor(0, cfg) == pytest.approx(1 / 1000)
    assert lr_factor(499, cfg) == pytest.approx(0.5)
    assert lr_factor(999, cfg) == lr_factor(49_999, cfg) == 1.0
    assert lr_factor(50_000, cfg) == pytest.approx(0.95)
    assert lr_factor(120_000, cfg) == pytest.approx(0.95 ** 2)
    assert lr_factor(0, OptimConfig(warmup_steps=0)) == 1.0
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = build_optimizer(model, OptimConfig(lr=2e-3, warmup_steps=4, betas=[0.8, 0.9]))
    lrs = []
    for _ in range(6):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([5e-4, 1e-3, 1.5e-3, 2e-3, 2e-3, 2e-3])
    assert optimizer.param_groups[0]["betas"] == (0.8, 0.9)


def test_compile_clock_counts_the_compiling_of_forward_and_backward_once():
    """The first call of a compiled function compiles its forward and, in the backward, its backward graph; the
    second call of the same shapes compiles nothing."""
    layer = torch.nn.Linear(4, 4)
    fn = torch.compile(lambda x: torch.sin(layer(x)).sum())
    before = compile_seconds()
    fn(torch.randn(3, 4)).backward()
    first = compile_seconds() - before
    before = compile_seconds()
    fn(torch.randn(3, 4)).backward()
    assert first > 0.05 and compile_seconds() - before == 0.0


def test_recycles_depend_only_on_seed_and_step():
    draws = [recycles_for_step(0, step, 3) for step in range(200)]
    assert draws == [recycles_for_step(0, step, 3) for step in range(200)]          # every rank draws the same
    assert set(draws) == {0, 1, 2, 3} and abs(np.mean(draws) - 1.5) < 0.3           # uniform on 0..3
    assert draws != [recycles_for_step(1, step, 3) for step in range(200)]
    assert {recycles_for_step(5, s, 0) for s in range(20)} == {0}
    seeds = {derived_seed(0, purpose, step, rank, 0) for purpose in range(3) for step in range(10) for rank in range(4)}
    assert len(seeds) == 120 and all(0 <= s < 2 ** 63 for s in seeds)


def test_ema_follows_the_weights_with_a_warmed_up_decay():
    model = torch.nn.Linear(3, 2)
    ema = EMA(model, decay=0.9)
    start = {k: v.clone() for k, v in ema.shadow.items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update()                                          # decay min(0.9, 1/10) = 0.1: 90 % of the way
    for name, p in model.named_parameters():
        torch.testing.assert_close(ema.shadow[name], start[name] + 0.9)
    assert ema.current_decay() == pytest.approx(2 / 11)
    ema.updates = 1000
    assert ema.current_decay() == 0.9
    live = {k: v.clone() for k, v in model.state_dict().items()}
    with ema.swapped():
        for name, p in model.named_parameters():
            assert p.equal(ema.shadow[name])
    for name, p in model.named_parameters():
        assert p.equal(live[name])                        # the model's own weights came back
    other = EMA(torch.nn.Linear(3, 2), 0.9)
    other.load_state_dict(ema.state_dict(), updates=7)
    assert other.updates == 7 and all(other.shadow[k].equal(ema.shadow[k]) for k in ema.shadow)
    with pytest.raises(ValueError, match="shape"):
        EMA(torch.nn.Linear(4, 2), 0.9).load_state_dict(ema.state_dict(), 0)


def fake_checkpoint(run, step, lddt=None):
    folder = ckpt.begin_checkpoint(run, step)
    (folder / "model.safetensors").write_bytes(b"x")
    return ckpt.commit_checkpoint(folder, {"step": step, "val": None if lddt is None else {"lddt_ca": lddt}})


def test_checkpoint_folders_list_resolve_prune_and_clean(tmp_path):
    run = tmp_path / "run"
    assert ckpt.list_checkpoints(run) == []
    with pytest.raises(FileNotFoundError, match="no such run"):
        ckpt.resolve_checkpoint(run)
    for step, lddt in [(10, 0.3), (20, None), (30, 0.5), (40, 0.4), (50, None)]:
        fake_checkpoint(run, step, lddt)
    (ckpt.begin_checkpoint(run, 60) / "model.safetensors").write_bytes(b"half")   # a write that never finished
    assert [c.step for c in ckpt.list_checkpoints(run)] == [10, 20, 30, 40, 50]
    assert ckpt.resolve_checkpoint(run) == run / "checkpoints" / "step_50"
    assert ckpt.resolve_checkpoint(run, prefer="best") == run / "checkpoints" / "step_30"
    assert ckpt.resolve_checkpoint(run / "checkpoints" / "step_20") == run / "checkpoints" / "step_20"
    with pytest.raises(FileNotFoundError, match="incomplete"):
        ckpt.resolve_checkpoint(run / "checkpoints" / ".tmp_step_60")
    removed = ckpt.prune_checkpoints(run, keep_last=2)
    assert sorted(p.name for p in removed) == ["step_10", "step_20"]
    assert [c.step for c in ckpt.list_checkpoints(run)] == [30, 40, 50]          # last two and the best
    assert [p.name for p in ckpt.clean_partial(run)] == [".tmp_step_60"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_30", "step_40", "step_50"]
    fake_checkpoint(run, 50, 0.9)                          # the same step again replaces it whole
    assert ckpt.read_state(run / "checkpoints" / "step_50")["val"] == {"lddt_ca": 0.9}
    assert ckpt.resolve_checkpoint(run, prefer="best").name == "step_50"
    run2 = tmp_path / "no_scores"
    fake_checkpoint(run2, 5)
    assert ckpt.resolve_checkpoint(run2, prefer="best").name == "step_5"        # no validation: the latest


def test_rng_states_round_trip_through_a_weights_only_file(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.normal()                                     # a cached Gaussian in numpy's state
    ckpt.save_torch(ckpt.rng_state(), tmp_path / "rng.pt")
    first = (random.random(), np.random.rand(3).tolist(), np.random.normal(), torch.rand(3).tolist())
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    ckpt.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    again = (random.random(), np.random.rand(3).tolist(), np.random.normal(), torch.rand(3).tolist())
    assert first == again


def test_fault_hook_only_fires_when_asked(monkeypatch):
    monkeypatch.setenv(ckpt.FAULT_ENV, "step@3")
    ckpt.fault_point("step", 2)                             # not this one: still alive
    ckpt.fault_point("checkpoint_write", 3)


def test_run_log_rewrites_after_resume_and_writes_json(tmp_path):
    log = RunLog(tmp_path, enabled=True, resume_step=None)
    for step in range(1, 6):
        log.write({"step": step, "split": "train", "loss": float(step), "grad_norm": float("nan")})
    log.write({"step": 5, "split": "val", "lddt_ca": 0.5})
    log.close()
    with open(tmp_path / "log.jsonl", "a") as handle:
        handle.write('{"step": 6, "spl')                   # a torn last line from a killed process
    rows = read_log(tmp_path / "log.jsonl")
    assert len(rows) == 6 and rows[0]["grad_norm"] is None
    resumed = RunLog(tmp_path, enabled=True, resume_step=3)
    resumed.write({"step": 4, "split": "train", "loss": 40.0})
    resumed.close()
    assert [(r["step"], r["loss"]) for r in read_log(tmp_path / "log.jsonl")] == [(1, 1.0), (2, 2.0), (3, 3.0),
                                                                                  (4, 40.0)]
    assert all(json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines())
    RunLog(tmp_path / "other", enabled=False, resume_step=None).write({"step": 1})
    assert not (tmp_path / "other").exists()


def test_watchdog_ends_a_stalled_process_with_a_message(capsys):
    exits = []
    dog = Watchdog(0.3, rank=1, exit_fn=exits.append, poll_s=0.05).start()
    for _ in range(10):                                     # beats keep it quiet
        dog.beat("training step 1")
        time.sleep(0.05)
    assert exits == []
    time.sleep(0.8)
    assert exits == [3]
    err = capsys.readouterr().err
    assert "rank 1 made no progress" in err and "while training step 1" in err and "stall_timeout_s" in err
    dog.stop()


def test_plots_are_written_from_log_rows(tmp_path):
    rows = [{"step": s, "split": "train", "loss": 10 - s / 10, "distogram": 4.0, "diffusion": 1.0,
             "smooth_lddt": 0.5, "plddt": 3.0, "grad_norm/pairformer": 1.0 + s, "grad_norm/diffusion": 0.0,
             "diffusion/sigma<0.25": 1.0, "diffusion/sigma>4": None if s % 2 else 2.0} for s in range(1, 60)]
    rows += [{"step": s, "split": "val", "lddt_ca": 0.2 + s / 300, "tm_score": 0.1, "rmsd": 12.0, "loss": 9.0,
              "contact_precision": None, "distogram_accuracy": 0.1} for s in (0, 30, 59)]
    paths = plot_run(rows, tmp_path, title="test")
    assert [p.name for p in paths] == ["losses.png", "validation.png", "gradients.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    plot_run(rows[:0], tmp_path)                            # an empty log still draws (empty axes)
