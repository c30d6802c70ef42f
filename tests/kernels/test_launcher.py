"""The launcher (mini_of3/kernels/launcher.py): a kernel launched through it writes what ``kernel[grid](...)``
writes, on the first call of a specialisation (through the JIT) and on later ones (the compiled kernel directly),
and arguments that Triton specialises on differently (a misaligned pointer, an integer equal to 1 or a multiple of
16, another dtype, another constexpr) never reuse a kernel compiled for others."""
import pytest
import torch
import triton
import triton.language as tl

from mini_of3.kernels import launcher
from mini_of3.kernels.launcher import launch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _axpy(x_ptr, y_ptr, out_ptr, n, stride, alpha, BLOCK: tl.constexpr, NEGATE: tl.constexpr = False):
    """out[i] = alpha * x[i * stride] + y[i] (or its negative), for i < n."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < n
    x = tl.load(x_ptr + offs * stride, mask=keep, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=keep, other=0.0).to(tl.float32)
    r = alpha * x + y
    if NEGATE:
        r = -r
    tl.store(out_ptr + offs, r.to(out_ptr.dtype.element_ty), mask=keep)


def axpy(x, y, alpha, stride=1, negate=None, block=64):
    n = y.numel()
    out = torch.full_like(y, float("nan"))
    kwargs = {} if negate is None else {"NEGATE": negate}
    launch(_axpy, (triton.cdiv(n, block),), x, y, out, n, stride, alpha, BLOCK=block, num_warps=4, **kwargs)
    return out


def expected(x, y, alpha, stride=1, negate=False):
    r = alpha * x[::stride][:y.numel()].double() + y.double()
    return (-r if negate else r).to(y.dtype)


def test_trailing_values_in_signature_order():
    """The compiled kernel takes every parameter positionally: the constexprs after the positional arguments come
    from the keywords, else from the signature's defaults."""
    assert launcher._trailing_values(_axpy, 6, {"BLOCK": 32, "num_warps": 4}) == (32, False)
    assert launcher._trailing_values(_axpy, 6, {"NEGATE": True, "BLOCK": 16}) == (16, True)


def test_launch_gives_the_reference():
    """Through the JIT (the interpreter, or a first call) and, on a GPU, through the compiled kernel."""
    gen = torch.Generator().manual_seed(0)
    for n, stride, negate, dtype in [(100, 1, None, torch.float32), (100, 1, None, torch.float32),
                                     (37, 2, True, torch.float32), (1, 1, None, torch.bfloat16)]:
        x = torch.randn(n * stride, generator=gen).to(DEVICE, dtype)
        y = torch.randn(n, generator=gen).to(DEVICE, dtype)
        got = axpy(x, y, 0.5, stride=stride, negate=negate)
        torch.testing.assert_close(got, expected(x, y, 0.5, stride, bool(negate)), rtol=1e-2 if n == 1 else 1e-6,
                                   atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled path needs a GPU")
def test_specialisations_are_kept_apart():
    """Repeated calls reuse one compiled kernel per key; a misaligned view, n = 1 and n = 16 (Triton's integer
    specialisations), another dtype and another constexpr each get their own, and every call writes the
    reference's values."""
    launcher._compiled.clear()
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(4096, generator=gen).to(DEVICE)
    cases = [(base[:1000], base[1000:2000]), (base[2000:3000], base[3000:4000]),   # one key, twice
             (base[1:1001], base[1001:2001]),                                       # misaligned pointers
             (base[:1], base[16:17]), (base[:16], base[16:32]),                     # n = 1, n = 16
             (base[:1000].bfloat16(), base[1000:2000].bfloat16())]                  # another dtype
    for x, y in cases:
        torch.testing.assert_close(axpy(x, y, 2.0), expected(x, y, 2.0), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(axpy(base[:1000], base[1000:2000], 2.0, negate=True),
                               expected(base[:1000], base[1000:2000], 2.0, negate=True))
    assert len(launcher._compiled) == 6      # the first two cases share one key
    assert len({id(entry[0]) for entry in launcher._compiled.values()}) == 6   # six kernels compiled by the JIT
