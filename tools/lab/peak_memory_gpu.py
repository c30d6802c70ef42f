"""What is alive at the peak of one forward + backward, on the GPU machine: every device allocation the call makes,
in order, with its size and the Python line that made it (torch.cuda.memory's allocation history), and the peak
above what was allocated before, as the bench measures it.

    python tools/lab/peak_memory_gpu.py [--impls mini_of3,trifast] [--n 768] [--d 32]
"""
from __future__ import annotations

import argparse

import torch

from mini_of3.bench.anchors import load_impls_reported
from mini_of3.bench.common import peak_mib
from mini_of3.bench.kernels import prepare


def allocations(fn, max_entries: int = 100_000) -> list[tuple[str, int, str, int]]:
    """(action, bytes, innermost Python frame of ours or the anchor's, address) for each allocation and free of
    ``fn``, the first ``max_entries`` recorded."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=max_entries)
    fn()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = []
    for trace in snapshot["device_traces"]:
        for e in trace:
            if e["action"] not in ("alloc", "free_completed"):
                continue
            frames = [f for f in e.get("frames", []) if f["filename"].endswith(".py")]
            where = next((f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}" for f in frames
                          if "torch/" not in f["filename"]), "?")
            events.append((e["action"], e["size"], where, e["addr"]))
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impls", default="mini_of3,trifast")
    parser.add_argument("--n", type=int, default=768)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    args = parser.parse_args()
    impls = load_impls_reported(args.impls)
    for impl in impls:
        p = prepare(impl, args.n, args.d, args.heads)
        p.fwdbwd(0)                                      # compile and autotune outside the record
        print(f"\n{impl.name} N={args.n} D={args.d}: peak {peak_mib(lambda: p.fwdbwd(0)):.3f} MiB above the inputs")
        live = peak = 0
        for action, size, where, _ in allocations(lambda: p.fwdbwd(0)):
            live += size if action == "alloc" else -size
            peak = max(peak, live)
            print(f"  {action:15s}{size / 2**20:10.3f} MiB  live {live / 2**20:9.3f}  {where}")
        print(f"  peak of the recorded events: {peak / 2**20:.3f} MiB")


if __name__ == "__main__":
    main()
