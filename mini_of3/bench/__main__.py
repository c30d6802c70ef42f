"""``python -m mini_of3.bench <name> [options]``: run one benchmark; each prints a table and writes JSON + PNG."""
import sys

COMMANDS = {"kernels": "mini_of3.bench.kernels", "step": "mini_of3.bench.step", "block": "mini_of3.bench.block",
            "fit": "mini_of3.bench.fit", "runs": "mini_of3.bench.runs", "trimul": "mini_of3.bench.trimul",
            "score": "mini_of3.bench.score", "sigmoid": "mini_of3.bench.sigmoid",
            "conditioning": "mini_of3.bench.conditioning"}
SUMMARY = {
    "kernels": "triangle attention against the anchors (ms, peak MiB, float64 errors, bitwise repeats)",
    "trimul": "the triangle multiplication alone (eager, torch.compile, cuEquivariance, ours)",
    "block": "one Pairformer block, per sub-layer and implementation",
    "step": "the real training step with the kernel backends swapped per arm",
    "fit": "train on a few entries and validate on the same ones (can the model fit?)",
    "runs": "training run folders as one result (step time, samples/s, loss against a reference run)",
    "score": "a run's checkpoint scored on whole entries, its training entries included",
    "sigmoid": "sigmoid attention (dense, padded, packed varlen) against TritonSigmoid and softmax SDPA",
    "conditioning": "does the denoiser read the trunk? (diffusion loss with the trunk's s and z zeroed)",
}
USAGE = f"usage: python -m mini_of3.bench {{{'|'.join(COMMANDS)}}} [options]   (<name> --help for its options)"


def main() -> None:
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(USAGE + "\n\n" + "\n".join(f"  {name:<13}{SUMMARY[name]}" for name in COMMANDS))
        return
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        raise SystemExit(USAGE)
    import importlib
    importlib.import_module(COMMANDS[sys.argv[1]]).main(sys.argv[2:])


if __name__ == "__main__":
    main()
