"""What the Gluon (Triton 3.6) lab probes share: the sm_90 target, the shared-memory layout of a TMA tile, the
offline compile with register/spill figures from the wheel's ptxas, and TMA loads of kept tiles and ring slots.
Imported by gluon_tri_attn_fwd.py (run from the repository root: tools/lab is its sys.path[0]), which takes the
wgmma layout and the shared-memory rings from mini_of3/kernels/sigmoid_attention_hopper.py (where the sigmoid
probes that also used this module became shipped kernels)."""
from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

TARGET = GPUTarget("cuda", 90, 32)
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


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


def compile_sm90(kernel, signature: dict, constexprs: dict, num_warps: int) -> tuple[object, str, int, int]:
    """Compile a Gluon kernel for sm_90 without a GPU; -> (compiled, PTX, registers per thread, spill store bytes)."""
    compiled = triton.compile(GluonASTSource(kernel, signature, constexprs), target=TARGET,
                              options={"num_warps": num_warps})
    ptx = compiled.asm["ptx"]
    return (compiled, ptx, *ptxas_usage(ptx))


# ---- pieces of the kernels: TMA loads into shared memory, rings of stages ----------------------------------------


@gluon.jit
def load_tile(desc, row, col, smem, bar):
    """TMA tile [row, col] of ``desc`` into ``smem``, and wait for it (phase 0 of ``bar``: loaded once)."""
    mbarrier.expect(bar, desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [row, col], bar, smem)
    mbarrier.wait(bar, 0)


@gluon.jit
def load_ring_pair(a_desc, b_desc, row, col, bar, a_slot, b_slot, pred):
    """TMA tiles [row, col] of two tensors into one ring slot, completing ``bar`` (when pred)."""
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(a_desc, [row, col], bar, a_slot, pred=pred)
    tma.async_copy_global_to_shared(b_desc, [row, col], bar, b_slot, pred=pred)


@gluon.jit
def alloc_tile(desc):
    """Shared memory for one tile of ``desc`` that stays for the whole loop, and the barrier of its load."""
    smem = gl.allocate_shared_memory(desc.dtype, desc.block_type.shape, desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    return smem, bar

