"""What the Gluon (Triton 3.6) lab probes share: the sm_90 target, the wgmma accumulator layout, the shared-memory
layout of a TMA tile, and register/spill figures from the wheel's ptxas. Imported by gluon_tri_attn_fwd.py,
gluon_sigmoid_fwd.py and gluon_sigmoid_bwd.py (run from the repository root: tools/lab is their sys.path[0])."""
from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

TARGET = GPUTarget("cuda", 90, 32)
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@gluon.constexpr_function
def mma_layout(block_n, num_warps):
    """wgmma accumulator layout for [rows, block_n] fp32 with warps stacked along the rows."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, block_n, 16])


def shared_layout(shape: list[int], dtype=gl.bfloat16):
    """The NVMMA shared layout of a TMA tile of ``shape`` (swizzle chosen by Gluon)."""
    return gl.NVMMASharedLayout.get_default_for(shape, dtype)


def ptxas_usage(ptx: str) -> tuple[int, int]:
    """-> (registers per thread, spill store bytes) from the wheel's ptxas -v on a kernel's PTX."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        log = subprocess.run([PTXAS, "-v", "--gpu-name=sm_90a", str(src), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    return int(re.search(r"Used (\d+) registers", log).group(1)), int(re.search(r"(\d+) bytes spill stores",
                                                                               log).group(1))
