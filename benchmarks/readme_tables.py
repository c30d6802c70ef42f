"""The README's two kernel tables from a bench JSON (`python -m mini_of3.bench kernels`), so that the figures in
the README are the measured ones, copied by no hand:

    python benchmarks/readme_tables.py benchmarks/results/kernels_<tag>_<commit>.json

Bold marks the best of each column (the N = 768, D = 32 table) or the fastest at each (N, D) (the ms table).
"""
from __future__ import annotations

import argparse
import json

LABELS = {   # impl -> (label, bias)
    "mini_of3": ("**mini_of3**", "fp32 bias"),
    "mini_of3_bf16bias": ("**mini_of3**", "bf16 bias"),
    "trifast": ("trifast 0.1.13", "bf16 bias"),
    "cueq": ("cuEquivariance 0.13", "fp32 bias"),
    "of3_triton": ("OpenFold3 0.5 Triton", "bf16 bias"),
}
SHORT = {"mini_of3": "mini_of3 fp32 bias", "mini_of3_bf16bias": "mini_of3 bf16 bias", "trifast": "trifast",
         "cueq": "cuEquivariance", "of3_triton": "OpenFold3 Triton"}


def sci(x: float) -> str:
    return f"{x:.1e}".replace("e-0", "e-").replace("e+0", "e")


def bold_if(text: str, best: bool) -> str:
    return f"**{text}**" if best else text


def headline_table(rows: list[dict], n: int = 768, d: int = 32) -> list[str]:
    """One line per implementation at (n, d): times, peak, errors, bitwise; the best of each column in bold."""
    cells = [r for r in rows if r["N"] == n and r["D"] == d and r["impl"] in LABELS]
    columns = [("fwd_ms", "{:.2f}"), ("fwdbwd_ms", "{:.2f}"), ("peak_mib", "{:.1f}")]   # lower is better in all
    errors = ("dq", "dk", "dbias")
    best = {key: min(r[key] for r in cells) for key, _ in columns}
    best.update({e: min(r["err"][e] for r in cells) for e in errors})
    lines = [f"| N = {n}, D = {d} | fwd ms | fwd+bwd ms | peak MiB | err dq | err dk | err dbias | bitwise |",
             "|---|---|---|---|---|---|---|---|"]
    for r in cells:
        label, bias = LABELS[r["impl"]]
        row = [f"{label} ({bias})"]
        row += [bold_if(fmt.format(r[key]), r[key] == best[key]) for key, fmt in columns]
        row += [bold_if(sci(r["err"][e]), r["err"][e] == best[e]) for e in errors]
        row.append("**yes**" if r["bitwise"] else "no")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def times_table(rows: list[dict]) -> list[str]:
    """fwd / fwd+bwd ms per implementation and N, D = 32 first; the fastest at each (N, D) in bold."""
    ns = sorted({r["N"] for r in rows})
    ds = sorted({r["D"] for r in rows}, reverse=True)
    at = {(r["impl"], r["N"], r["D"]): r for r in rows}
    lines = ["| ms: fwd / fwd+bwd | " + " | ".join(str(n) for n in ns) + " |", "|---" * (len(ns) + 1) + "|"]
    for d in ds:
        for impl in SHORT:
            if not any((impl, n, d) in at for n in ns):
                continue
            row = [f"{SHORT[impl]}, D = {d}"]
            for n in ns:
                r = at.get((impl, n, d))
                if r is None:
                    row.append("—")
                    continue
                peers = [at[key] for key in at if key[1:] == (n, d) and key[0] in SHORT]
                fwd = bold_if(f"{r['fwd_ms']:.2f}", r["fwd_ms"] == min(p["fwd_ms"] for p in peers))
                both = bold_if(f"{r['fwdbwd_ms']:.2f}", r["fwdbwd_ms"] == min(p["fwdbwd_ms"] for p in peers))
                row.append(f"{fwd} / {both}")
            lines.append("| " + " | ".join(row) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", help="a bench result, benchmarks/results/kernels_<tag>_<commit>.json")
    args = parser.parse_args()
    with open(args.json) as f:
        result = json.load(f)
    print(f"<!-- {args.json}, commit {result['commit']} -->")
    print("\n".join(headline_table(result["rows"])))
    print()
    print("\n".join(times_table(result["rows"])))


if __name__ == "__main__":
    main()
