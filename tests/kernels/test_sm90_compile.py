"""What the CPU interpreter cannot check of the GPU path, checked without a GPU: the sigmoid kernels with their
inline PTX (rcp, series, tanh) compile and assemble for sm_90 with Triton's own ptxas, and the series evaluation
keeps its warp-uniform branch (a vote and real branches, not predicated paths). Runs tools/lab/kernel_resources.py
in a process without TRITON_INTERPRET (under the interpreter ``triton.jit`` gives functions that cannot compile)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
ROOT = Path(__file__).resolve().parents[2]


def compiled_rows(*args: str) -> dict[str, dict[str, int]]:
    """kernel_resources.py's rows by kernel name: {name: {"MUFU": .., "VOTE": .., "BRA": .., "LDL": ..}}."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])    # this checkout's mini_of3
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "lab" / "kernel_resources.py"), *args],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("kernel"))
    rows = {}
    for line in lines[header + 1:]:
        fields = line.split()
        name = " ".join(fields[:-15])          # the name, then 11 numbers, mma, MUFU, VOTE, BRA, instr
        numbers = fields[-15:]
        rows[name] = dict(LDL=int(numbers[7]), MUFU=int(numbers[11]), VOTE=int(numbers[12]), BRA=int(numbers[13]))
    return rows


@pytest.mark.skipif(not PTXAS.exists(), reason="Triton's ptxas is not installed")
def test_sigmoid_evaluations_assemble_for_sm90_and_series_branches_per_warp():
    rows = compiled_rows("--kernel", "sigmoid", "--head-dim", "64", "--sigmoid", "rcp,series,tanh")
    for kernel in ("fwd", "dkdv", "dkdv +dS", "dq"):
        rcp, series, tanh = (rows[f"{kernel} {variant}"] for variant in ("rcp", "series", "tanh"))
        assert rcp["VOTE"] == 0 and tanh["VOTE"] == 0 and series["VOTE"] > 0, kernel
        assert series["BRA"] >= rcp["BRA"] + 2 * series["VOTE"], kernel       # two branches per vote
        assert tanh["MUFU"] < rcp["MUFU"] < series["MUFU"], kernel            # 1, 2 and 1 + 2 (both paths) ops
    assert rows["dq from dS"]["MUFU"] == 0
