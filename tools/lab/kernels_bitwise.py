"""The fused kernels of an earlier commit against the working tree's, bitwise: outputs and every gradient.

    python tools/lab/kernels_bitwise.py --extract COMMIT            (here, with git: writes .device/old/old_kernels)
    python tools/lab/kernels_bitwise.py [--select KEY=V1|V2,...] [--out DIR]
                                           (CPU under TRITON_INTERPRET=1, or the GPU; carry .device to the GPU machine)

The old ``mini_of3/kernels`` becomes the package ``old_kernels`` (kernels_before_after.py's ``extract``: imports and
torch.library namespace renamed), so both versions run side by side in one process on the same fresh random inputs:
triangle attention (softmax and sigmoid, with a mask, bias float32 and in the input dtype, gated and plain, split_ds
True and False passed explicitly, the starting node's contiguous layout and the ending node's transposed views),
triangle multiplication (outgoing and incoming, with a mask, float32 and under bf16 autocast) and the transition
(float32 and under bf16 autocast); each with gradients and once without (the inference path). Fixed tiles
(MINI_OF3_AUTOTUNE=0) on both sides: a refactoring must leave the algorithm's bits alone, while the autotuner may
pick other tiles from one process to the next. On the CPU (interpreter) tiny sizes, on the GPU the model's: N = 256,
D = 32, H = 4, C = h = 128, bf16. ``--select`` keeps the cases whose fields match (e.g. ``op=triangle_attention,
activation=softmax``; ``|`` between alternatives), so that parts can run side by side: most of a GPU run is the
compilation of both versions' kernels. Prints one line per case and writes kernels_bitwise.json
(``"bench": "bitwise"``).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before any kernel module is imported
os.environ["MINI_OF3_AUTOTUNE"] = "0"

from kernels_before_after import OLD_ROOT, extract  # noqa: E402  (tools/lab, beside this file)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def sizes() -> dict:
    if DEVICE == "cuda":
        return dict(B=1, N=256, H=4, D=32, C=128, hidden=128, rows=256)
    return dict(B=1, N=19, H=2, D=16, C=16, hidden=32, rows=5)


def leaves(tensors: dict, grad: bool) -> dict:
    """Fresh copies of the inputs (same bits and strides) as autograd leaves."""
    out = {}
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
            out[name] = copy.requires_grad_(grad)
        else:
            out[name] = t
    return out


def outputs_and_grads(call, tensors: dict, dout_seed: int, grad: bool, autocast: bool) -> list[torch.Tensor]:
    """[output, gradient of every floating-point input] (output only without ``grad``)."""
    inputs = leaves(tensors, grad)
    ctx = torch.autocast(DEVICE, dtype=torch.bfloat16) if autocast else torch.autocast(DEVICE, enabled=False)
    with ctx, torch.set_grad_enabled(grad):
        out = call(**inputs)
    if not grad:
        return [out]
    g = torch.Generator(DEVICE).manual_seed(dout_seed)
    dout = torch.randn(out.shape, generator=g, device=DEVICE).to(out.dtype)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in inputs.values() if isinstance(t, torch.Tensor) and t.requires_grad]


def attention_cases():
    for activation in ("softmax", "sigmoid"):
        for gated in (False, True):
            for layout in ("start", "end"):
                for bias_dtype in ("fp32", "bf16"):
                    for split_ds in (False, True):
                        yield dict(op="triangle_attention", activation=activation, gated=gated, layout=layout,
                                   bias=bias_dtype, split_ds=split_ds)


def attention_inputs(case: dict, s: dict, seed: int) -> dict:
    """q, k, v (or qkvg) [B, I, J, (4,) H, D] bf16 as the model passes them (the ending node: transposed views of
    one projection), bias [B, H, J, K], a mask [B, I, K] with a fully masked row."""
    B, N, H, D = s["B"], s["N"], s["H"], s["D"]
    g = torch.Generator().manual_seed(seed)
    packed = torch.randn(B, N, N, 4, H, D, generator=g).to(DEVICE, torch.bfloat16)     # [B, I, J, 4, H, D]
    if case["layout"] == "end":
        packed = packed.transpose(1, 2)
    bias = torch.randn(B, H, N, N, generator=g).to(DEVICE)
    bias = bias if case["bias"] == "fp32" else bias.to(torch.bfloat16)
    mask = (torch.rand(B, N, N, generator=g) > 0.2).to(DEVICE)
    mask[:, 0] = False
    if case["gated"]:
        return dict(qkvg=packed, bias=bias, mask=mask)
    q, k, v, _ = packed.unbind(3)
    return dict(q=q, k=k, v=v, bias=bias, mask=mask)


def attention_call(module, case: dict):
    kw = dict(activation=case["activation"], backend="triton", split_ds=case["split_ds"])
    if case["gated"]:
        return lambda qkvg, bias, mask: module.gated_triangle_attention(qkvg, bias, mask, **kw)
    return lambda q, k, v, bias, mask: module.triangle_attention(q, k, v, bias, mask, **kw)


WEIGHTS_TRI_MUL = ("norm_in_weight", "norm_in_bias", "p_in_weight", "g_in_weight", "norm_out_weight",
                   "norm_out_bias", "p_out_weight", "g_out_weight")


def tri_mul_inputs(s: dict, seed: int) -> dict:
    B, N, C, h = s["B"], s["N"], s["C"], s["hidden"]
    g = torch.Generator().manual_seed(seed)
    shapes = dict(norm_in_weight=(C,), norm_in_bias=(C,), p_in_weight=(2 * h, C), g_in_weight=(2 * h, C),
                  norm_out_weight=(h,), norm_out_bias=(h,), p_out_weight=(C, h), g_out_weight=(C, C))
    weights = {name: (torch.randn(shape, generator=g) * (0.2 if len(shape) == 1 else shape[-1] ** -0.5)
                      + (1.0 if name.startswith("norm") and name.endswith("weight") else 0.0))
               for name, shape in shapes.items()}
    token = torch.rand(B, N, generator=g) > 0.15
    return dict(z=torch.randn(B, N, N, C, generator=g).to(DEVICE),
                mask=(token[:, :, None] & token[:, None, :]).to(DEVICE),
                **{k: v.to(DEVICE) for k, v in weights.items()})


def transition_inputs(s: dict, seed: int) -> dict:
    C, rows, n = s["C"], s["rows"], 4
    g = torch.Generator().manual_seed(seed)
    return dict(x=torch.randn(1, rows, rows, C, generator=g).to(DEVICE),
                norm_weight=(1 + 0.2 * torch.randn(C, generator=g)).to(DEVICE),
                norm_bias=(0.2 * torch.randn(C, generator=g)).to(DEVICE),
                a_weight=(torch.randn(n * C, C, generator=g) / C ** 0.5).to(DEVICE),
                b_weight=(torch.randn(n * C, C, generator=g) / C ** 0.5).to(DEVICE),
                out_weight=(torch.randn(C, n * C, generator=g) / (n * C) ** 0.5).to(DEVICE))


def all_cases(s: dict):
    """(case description, inputs, (module -> call), autocast)."""
    for seed, case in enumerate(attention_cases()):
        yield case, attention_inputs(case, s, seed), (lambda m, c=case: attention_call(m, c)), False
    for seed, (direction, autocast) in enumerate([(d, a) for d in ("outgoing", "incoming") for a in (False, True)]):
        case = dict(op="triangle_multiplication", direction=direction, dtype="bf16 autocast" if autocast else "fp32")
        yield (case, tri_mul_inputs(s, 100 + seed),
               (lambda m, d=direction: lambda z, mask, **w: m.triangle_multiplication(z, mask, direction=d,
                                                                                       backend="triton", **w)),
               autocast)
    for autocast in (False, True):
        case = dict(op="transition", dtype="bf16 autocast" if autocast else "fp32")
        yield (case, transition_inputs(s, 200 + autocast),
               (lambda m: lambda x, **w: m.transition(x, backend="triton", **w)), autocast)


def selected(case: dict, select: dict[str, set[str]]) -> bool:
    return all(str(case.get(key)) in values for key, values in select.items())


def compare(old, new, s: dict, select: dict[str, set[str]]) -> list[dict]:
    rows = []
    for case, inputs, make_call, autocast in all_cases(s):
        if not selected(case, select):
            continue
        row = dict(case)
        for grad in (True, False):
            got = [outputs_and_grads(make_call(module), inputs, 7, grad, autocast) for module in (old, new)]
            same = len(got[0]) == len(got[1]) and all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
                                                      for a, b in zip(*got))
            row["bitwise" if grad else "bitwise_inference"] = same
            if grad:
                row["tensors"] = len(got[1])
        rows.append(row)
        described = " ".join(f"{k}={v}" for k, v in case.items() if k != "op")
        print(f"{case['op']:24s} {described:70s} outputs+grads {row['tensors']:2d}: bitwise {row['bitwise']}, "
              f"inference {row['bitwise_inference']}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--extract", metavar="COMMIT", help="write the kernels of COMMIT as old_kernels, then stop")
    parser.add_argument("--select", default="", help="KEY=VALUE[|VALUE...] filters, comma-separated")
    parser.add_argument("--out", default=None, help="folder for kernels_bitwise.json (default: none written)")
    args = parser.parse_args()
    select = {key: set(values.split("|")) for key, values in (item.split("=", 1) for item in args.select.split(",")
                                                              if item)}
    if args.extract:
        extract(args.extract)
        return
    sys.path.insert(0, str(OLD_ROOT))
    import old_kernels

    import mini_of3.kernels as new_kernels
    from mini_of3.bench.common import result_header, write_json
    s = sizes()
    rows = compare(old_kernels, new_kernels, s, select)
    ok = all(r["bitwise"] and r["bitwise_inference"] for r in rows)
    before = (OLD_ROOT / "COMMIT").read_text().strip()
    print(f"\n{DEVICE} ({'interpreter' if DEVICE == 'cpu' else torch.cuda.get_device_name()}), sizes {s}: "
          f"{sum(r['bitwise'] and r['bitwise_inference'] for r in rows)}/{len(rows)} cases bitwise equal to "
          f"{before}: {'ALL BITWISE' if ok else 'DIFFERENCES'}")
    if args.out:
        result = result_header("bitwise", prog="python tools/lab/kernels_bitwise.py")
        result.update(before_commit=before, sizes=s, select=args.select, rows=rows, all_bitwise=ok)
        write_json(result, Path(args.out) / "kernels_bitwise.json")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
