"""What the CPU interpreter cannot check of the GPU path, checked without a GPU: the sigmoid kernels with their
inline PTX (rcp, tanh) compile and assemble for sm_90 with Triton's own ptxas, in every layout, each with the
special-function instructions its evaluation needs. Runs tools/lab/kernel_resources.py in a process without
TRITON_INTERPRET (under the interpreter ``triton.jit`` gives functions that cannot compile)."""
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
    columns = lines[header].split()[1:]       # after the name (which may hold spaces): one value per column
    return {" ".join(line.split()[:-len(columns)]): dict(zip(columns, line.split()[-len(columns):]))
            for line in lines[header + 1:]}


@pytest.mark.skipif(not PTXAS.exists(), reason="Triton's ptxas is not installed")
@pytest.mark.parametrize("layout", ["dense", "varlen"])
def test_sigmoid_evaluations_assemble_for_sm90(layout):
    rows = compiled_rows("--kernel", "sigmoid", "--head-dim", "64", "--sigmoid", "rcp,tanh", "--layout", layout)
    for kernel in ("fwd", "dkdv", "dkdv +dS", "dq"):
        rcp, tanh = (rows[f"{kernel} {variant}"] for variant in ("rcp", "tanh"))
        assert 0 < int(tanh["MUFU"]) < int(rcp["MUFU"]), kernel           # one and two operations per score
        assert rcp["mma"] == tanh["mma"] == "HGMMA", kernel
    assert int(rows["dq from dS"]["MUFU"]) == 0


@pytest.mark.skipif(not PTXAS.exists(), reason="Triton's ptxas is not installed")
def test_hopper_sigmoid_kernels_assemble_for_sm90():
    """The Gluon kernels (sigmoid_attention_hopper.py) at their default tiles: wgmma, within an SM's shared memory,
    one special-function instruction per score with tanh and two with rcp; no spills but in the one-kernel
    backward, whose loop holds dK, dV and a quarter of dQ (a few spilled scalars, no accumulator)."""
    rows = compiled_rows("--kernel", "sigmoid_hopper", "--sigmoid", "rcp,tanh", "--head-dim", "128")
    for kernel in ("fwd", "fwd packed", "dkdv", "dq", "bwd", "bwd pairs"):
        rcp, tanh = (rows[f"hopper {kernel} {variant}"] for variant in ("rcp", "tanh"))
        for row in (rcp, tanh):
            assert row["mma"] == "HGMMA", (kernel, row)
            if kernel.startswith("bwd"):   # spilled scalars: ~110-140 loads; a spilled accumulator ~1,200
                assert int(row["LDL"]) < 400, (kernel, row)
            else:
                assert row["LDL"] == row["STL"] == "0", (kernel, row)
            assert int(row["smem"]) <= 227 * 1024, (kernel, row)
        assert 2 * int(tanh["MUFU"]) == int(rcp["MUFU"]), kernel
