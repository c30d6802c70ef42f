"""Device-side Triton helpers shared by the kernels of every op: the float32-accumulating dot and the exponential and
sigmoid on the special-function unit.

    dot(a, b, DOT_PREC, acc=None)   a @ b (+ acc) in float32; DOT_PREC from ``host.dot_precision``
    exp2(x, FAST)                   2^x; FAST: the approximate instruction (GPU only)
    sigmoid2(x2, FAST)              sigmoid(x) from x2 = x * log2(e)
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dot(a, b, DOT_PREC: tl.constexpr, acc=None):
    """a @ b (+ acc) accumulated in float32. DOT_PREC "upcast" (the interpreter, whose bf16 dot is wrong in triton
    3.9) multiplies the same values in float32, which is exact for 16-bit operands."""
    if DOT_PREC == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc=acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc=acc, input_precision=DOT_PREC)


@triton.jit
def exp2(x, FAST: tl.constexpr):
    """2^x. FAST (GPU only) issues the special-function unit's ex2 directly, without the subnormal fix-up."""
    if FAST:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(x)


@triton.jit
def sigmoid2(x2, FAST: tl.constexpr):
    """sigmoid(x) from x2 = x * log2(e): 1 / (1 + 2^-x2); 0 at x2 = -inf (masked keys). FAST (GPU only): the
    approximate ex2 and reciprocal instructions, without the full-range division's fix-ups."""
    denominator = 1.0 + exp2(-x2, FAST)
    if FAST:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [denominator], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return 1.0 / denominator
