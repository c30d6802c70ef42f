"""What the Gluon (Triton 3.6) lab probes share: the sm_90 target, the wgmma accumulator layout, the shared-memory
layout of a TMA tile, the offline compile with register/spill figures from the wheel's ptxas, and the kernels'
TMA loads and shared-memory rings. Imported by gluon_tri_attn_fwd.py (run from the repository root: tools/lab is
its sys.path[0]); the sigmoid probes that used it became mini_of3/kernels/sigmoid_attention_hopper.py."""
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


@gluon.jit
def alloc_rings(tile_desc, NS: gl.constexpr, N_CONSUMERS: gl.constexpr):
    """Two rings [NS, *tile] (K and V, or Q and dO), a 'ready' barrier per slot (the loads' bytes) and an 'empty'
    one (arrived on by each of N_CONSUMERS consumers)."""
    a_ring = gl.allocate_shared_memory(tile_desc.dtype, [NS] + tile_desc.block_type.shape, tile_desc.layout)
    b_ring = gl.allocate_shared_memory(tile_desc.dtype, [NS] + tile_desc.block_type.shape, tile_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NS):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=N_CONSUMERS)
    return a_ring, b_ring, ready, empty
