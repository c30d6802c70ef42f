"""The shared host helpers (mini_of3/kernels/host.py).

The launch: a kernel launched through it writes what ``kernel[grid](...)`` writes, on the first call of a
specialisation (through the JIT) and on later ones (the compiled kernel directly), and arguments that Triton
specialises on differently (a misaligned pointer, an integer equal to 1 or a multiple of 16, another dtype, another
constexpr) never reuse a kernel compiled for others. Then the tile overrides, the dispatch and the persistent grids.
"""
import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from mini_of3.kernels import host
from mini_of3.kernels.host import launch

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
    assert host._trailing_values(_axpy, 6, {"BLOCK": 32, "num_warps": 4}) == (32, False)
    assert host._trailing_values(_axpy, 6, {"NEGATE": True, "BLOCK": 16}) == (16, True)


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
    host._compiled.clear()
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
    assert len(host._compiled) == 6      # the first two cases share one key
    assert len({id(entry[0]) for entry in host._compiled.values()}) == 6   # six kernels compiled by the JIT


def test_descriptor_arguments_key_by_their_type(monkeypatch):
    """A Gluon TMA descriptor keys by what its type holds (dtype, block shape, shared layout, padding) and not by
    its base, shape or strides, which the kernel takes at run time."""
    @dataclasses.dataclass
    class Descriptor:
        base: torch.Tensor
        shape: list
        strides: list
        block_shape: list
        layout: str
        padding: str = "zero"

    a, b = torch.zeros(64, 8), torch.zeros(128, 8, dtype=torch.bfloat16)
    key = lambda *descriptors: host.specialisation_key(_axpy, descriptors, {})   # noqa: E731
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert key(Descriptor(a, [64, 8], [8, 1], [16, 8], "s")) == key(Descriptor(torch.ones(32, 8), [32, 8], [8, 1],
                                                                               [16, 8], "s"))
    for other in (Descriptor(a, [64, 8], [8, 1], [32, 8], "s"), Descriptor(a, [64, 8], [8, 1], [16, 8], "t"),
                  Descriptor(b, [128, 8], [8, 1], [16, 8], "s"), Descriptor(a, [64, 8], [8, 1], [16, 8], "s", "nan")):
        assert key(other) != key(Descriptor(a, [64, 8], [8, 1], [16, 8], "s"))


# ---- tile overrides and the dispatch ----

@dataclasses.dataclass(frozen=True, kw_only=True)
class _Tiles:
    block: int = 64
    warps: int = 4


def test_tile_override_nests_restores_and_rejects_unknown_fields():
    """Fields set inside ``with`` apply to every call meanwhile, nested overrides add to the outer one, and leaving
    restores what was in force; ``active`` also with no field (an op then launches fixed tiles, no autotuning)."""
    override = host.TileOverride("tiles", _Tiles)
    tiles_of = override.cached(lambda n: override.apply(_Tiles(block=n)))
    assert not override.active and tiles_of(32) == _Tiles(block=32)
    with override():
        assert override.active and tiles_of(32) == _Tiles(block=32)
    with override(warps=8):
        assert tiles_of(32) == _Tiles(block=32, warps=8)
        with override(block=16):
            assert tiles_of(32) == _Tiles(block=16, warps=8)
        assert tiles_of(32) == _Tiles(block=32, warps=8)
    assert not override.active and tiles_of(32) == _Tiles(block=32)
    with pytest.raises(ValueError, match="unknown fields"), override(block_m=64):
        pass


def test_dispatch_takes_the_forward_without_gradients_and_the_eager_function_with_them():
    """Inference runs the forward alone (no autograd node); with gradients the eager autograd.Function calls the
    forward and backward directly; under torch.compile the custom op is traced (tests/kernels/test_*: each op
    compiles with fullgraph=True and gives the eager path's bits)."""
    calls = []

    def forward(x, scale):
        calls.append("forward")
        return x * scale

    def setup_context(ctx, inputs, output):
        ctx.scale = inputs[1]

    def autograd_backward(ctx, grad, backward_fn=None):
        return backward_fn(grad, ctx.scale), None

    def backward(grad, scale):
        calls.append("backward")
        return grad * scale

    eager = host.eager_function("_Scale", forward, setup_context, autograd_backward, backward)
    x = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        out = host.dispatch(None, eager, forward, (x, 2.0), host.needs_grad(x))
    assert out.grad_fn is None and calls == ["forward"]
    out = host.dispatch(None, eager, forward, (x, 2.0), host.needs_grad(x))
    out.sum().backward()
    assert calls == ["forward", "forward", "backward"] and torch.equal(x.grad, torch.full((3,), 2.0))


def test_persistent_programs(monkeypatch):
    """per_sm programs per SM, never more than the tiles (0: one per tile); balanced: as few as give every program
    the same number of tiles, at most one less; two under the interpreter."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(host, "interpreting", lambda: False)
    monkeypatch.setattr(host, "num_sms", lambda device: 4)
    assert [host.persistent_programs(n, 2, cpu) for n in (3, 20, 100)] == [3, 8, 8]
    assert [host.persistent_programs(n, 2, cpu, balanced=True) for n in (3, 20, 100)] == [3, 7, 8]   # 20 = 7 x 3 - 1
    assert host.persistent_programs(20, 0, cpu) == 20
    monkeypatch.setattr(host, "interpreting", lambda: True)
    assert host.persistent_programs(20, 2, cpu, balanced=True) == 2 and host.persistent_programs(1, 0, cpu) == 1
