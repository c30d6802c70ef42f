"""Helpers of the trainer tests: a tiny config, a small prepared data set, and train.py in a subprocess, on one
process or several (``accelerate launch``, gloo on the CPU; FSDP2 on the CPU through :func:`train_fsdp_on_cpu`)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

from mini_of3.config import Config, load_config

REPO = Path(__file__).resolve().parents[2]
SMALL_ENTRIES = ("1CRN", "1L2Y", "2OFG", "4ZEY", "1A7G")    # 46, 20, 111, 84, 82 residues (shared set)
OFFLINE_ENTRIES = ("5PTI", "1BD2", "3PWP", "3KPR")         # the fallback when only the offline package is there
CHECKPOINT_FILES = {"model.safetensors", "ema.safetensors", "optimizer.pt", "scheduler.pt", "rng_0.pt",
                    "config.yaml", "trainer_state.json"}       # a complete checkpoint of a single-process run

# The tiny model of tests/model/tiny.py, with pair dropout on (exact resume must replay the dropout masks) and two
# recycles (so the per-step recycle count varies).
TINY_MODEL = dict(n_blocks=1, c_s=32, c_z=16, n_heads_tri=2, c_hidden_tri=16, n_heads_single=2, c_hidden_mul=16,
                  transition_factor=2, pair_dropout=0.25, n_recycles=2, tri_attn_backend="torch",
                  checkpointing=False, diffusion_blocks=1, diffusion_heads=2, c_token=32, diffusion_samples=2,
                  plddt_rollout_steps=2, sampling_steps=3)


def tiny_overrides(prepared: Path, out_dir: Path, val_id: str, **extra) -> list[str]:
    """``key=value`` overrides of a 6-step run of the tiny model on ``prepared`` (checkpoints and validation every 3
    steps), with ``extra`` (``trainer__max_steps=4`` style keys) on top."""
    values = {"wandb": "false", "data.root": prepared, "data.cache_dir": prepared, "data.val_ids": f"[{val_id}]",
              "data.train_eval_ids": "[]",
              "data.crop_size": 32, "data.num_workers": 0, "data.batch_size": 1, "optim.warmup_steps": 2,
              "optim.lr": "1e-3", "trainer.max_steps": 6, "trainer.checkpoint_every": 3, "trainer.val_every": 3,
              "trainer.keep_last": 2, "trainer.out_dir": out_dir, "trainer.val_samples": 2}
    values.update({f"model.{k}": v for k, v in TINY_MODEL.items()})
    values.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()]


def tiny_config(small_data: tuple[Path, str], out: Path, **extra) -> Config:
    """The config of :func:`tiny_overrides` on top of configs/default.yaml, as train.py builds it, for an in-process
    ``train``; ``small_data`` is conftest's (prepared folder, validation id)."""
    prepared, val_id = small_data
    return load_config(REPO / "configs" / "default.yaml", tiny_overrides(prepared, out, val_id, **extra))


def train_env(fault: str | None = None, stall: str | None = None) -> dict[str, str]:
    """The environment of a train.py subprocess: one thread, wandb offline and quiet, unbuffered output; with
    ``fault``, the process SIGKILLs itself at that point (MINI_OF3_FAULT), with ``stall`` (``<point>@<step>/<rank>``)
    that rank hangs there (MINI_OF3_STALL; see mini_of3.training.checkpoint.fault_point)."""
    # one thread: on a shared 2-core machine, two OpenMP threads wait on each other whenever another job holds a core
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "OMP_NUM_THREADS": "1"}
    for name, value in (("MINI_OF3_FAULT", fault), ("MINI_OF3_STALL", stall)):
        env.pop(name, None)
        if value is not None:
            env[name] = value
    return env


def run_train(args: list[str], *, fault: str | None = None, stall: str | None = None, timeout: float = 300,
              launcher: list[str] | None = None, script: str = "train.py") -> subprocess.CompletedProcess:
    """``python train.py ARGS`` (or ``LAUNCHER SCRIPT ARGS``, e.g. with :func:`launcher`) in the repository root,
    in :func:`train_env` (``fault``, ``stall``)."""
    command = [*(launcher or [sys.executable]), script, *map(str, args)]
    return subprocess.run(command, cwd=REPO, env=train_env(fault, stall), capture_output=True, text=True,
                          timeout=timeout)


def start_train(args: list[str]) -> subprocess.Popen:
    """``python train.py ARGS`` started in the background in :func:`train_env`, as the leader of a new process group
    (``start_new_session``), so that a test can signal the whole job as a scheduler does (``os.killpg``)."""
    return subprocess.Popen([sys.executable, "train.py", *map(str, args)], cwd=REPO, env=train_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def launcher(processes: int, *, fsdp: bool = False) -> list[str]:
    """``accelerate launch`` of ``processes`` processes on this machine (gloo on the CPU), for :func:`run_train`.

    DDP: ``--multi_gpu`` (``--cpu`` would start a single process). ``fsdp``: configs/accelerate/fsdp.yaml, with
    :func:`train_fsdp_on_cpu` as the script (pass ``script=FSDP_ON_CPU``). A free port each time, so that test
    sessions running side by side do not meet on accelerate's default port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes),
               "--num_machines", "1", "--main_process_port", str(port), "--dynamo_backend", "no"]
    if fsdp:
        return [*command, "--config_file", str(REPO / "configs" / "accelerate" / "fsdp.yaml"), "-m"]
    return [*command, "--multi_gpu", "--mixed_precision", "no"]


FSDP_ON_CPU = "tests.trainer.helpers"          # the module that launcher(fsdp=True) runs: train_fsdp_on_cpu below


def train_fsdp_on_cpu(argv: list[str]) -> int:
    """train.py's main under FSDP2 on CPU processes. accelerate makes every multi-process CPU run plain DDP
    (MULTI_CPU), even with an FSDP config; this turns the state it builds back into FSDP with the config's plugin,
    so that the trainer's FSDP2 path (sharded DTensor weights and EMA, full-state checkpoints, validation through
    the gathered ``sample``) runs on gloo. torch's fully_shard works on CPU device meshes."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = init
    sys.path.insert(0, str(REPO))
    import train

    return train.main(argv)


def log_rows(run_dir: Path, split: str = "train") -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("split") == split]


def assert_same_run(resumed: Path, reference: Path) -> None:
    """A run folder that repeats the 6-step ``reference`` bitwise: every logged training loss and part, the final
    validation, the final weights and EMA."""
    got, want = log_rows(resumed), log_rows(reference)
    assert [r["step"] for r in got] == list(range(1, 7)), [r["step"] for r in got]
    for a, b in zip(got, want):
        for key in ("loss", "distogram", "diffusion", "smooth_lddt", "plddt", "grad_norm", "lr", "recycles", "epoch"):
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
    assert log_rows(resumed, "val")[-1]["lddt_ca"] == log_rows(reference, "val")[-1]["lddt_ca"]
    for name in ("model.safetensors", "ema.safetensors"):
        a = load_file(resumed / "checkpoints" / "step_6" / name)
        b = load_file(reference / "checkpoints" / "step_6" / name)
        assert a.keys() == b.keys()
        different = [k for k in a if not a[k].equal(b[k])]
        assert not different, f"{name}: {len(different)} tensors differ, e.g. {different[:3]}"


def describe(done: subprocess.CompletedProcess) -> str:
    """The end of a finished process's output, for assertion messages."""
    return f"exit {done.returncode}\n--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-3000:]}"


if __name__ == "__main__":                       # accelerate launch ... -m tests.trainer.helpers ARGS
    sys.exit(train_fsdp_on_cpu(sys.argv[1:]))
