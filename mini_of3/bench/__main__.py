"""``python -m mini_of3.bench <name> [options]``: run one benchmark; each prints a table and writes JSON + PNG."""
import sys

COMMANDS = {"kernels": "mini_of3.bench.kernels", "step": "mini_of3.bench.step", "block": "mini_of3.bench.block",
            "fit": "mini_of3.bench.fit", "runs": "mini_of3.bench.runs", "trimul": "mini_of3.bench.trimul",
            "score": "mini_of3.bench.score", "sigmoid": "mini_of3.bench.sigmoid",
            "conditioning": "mini_of3.bench.conditioning"}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        raise SystemExit(f"usage: python -m mini_of3.bench {{{'|'.join(COMMANDS)}}} [options]")
    import importlib
    importlib.import_module(COMMANDS[sys.argv[1]]).main(sys.argv[2:])


if __name__ == "__main__":
    main()
