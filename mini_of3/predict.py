"""Predict structures with a trained checkpoint:

    python -m mini_of3.predict CHECKPOINT INPUT [--out DIR] [--recycles R] [--steps S] [--samples K] [--seed X]
                               [--device cpu|cuda] [--overwrite]

CHECKPOINT is a run folder (its best checkpoint by validation lDDT, else its latest; a damaged one is skipped, with
the reason) or one checkpoint folder; the EMA weights are used. INPUT is an mmCIF file (``.cif``, ``.cif.gz``,
``.mmcif``) or a FASTA file (one chain per record, the 20 amino-acid letters and X for an unknown residue; identical
sequences form one entity). K structures are sampled and ranked by mean pLDDT; each is written as
``DIR/<name>_rank<k>.cif`` (one CA atom per residue, pLDDT in the B-factors), with ``DIR/<name>.json`` (the input,
the checkpoint, one row per sample); DIR defaults to the ``predictions`` folder of the checkpoint's run. ``<name>`` is
the input's file name without suffix, preceded by its folder names where another input of that name was predicted
into DIR before; existing outputs of the same input are kept unless ``--overwrite``. For an mmCIF input the deposited
structure is the truth: lDDT-Calpha, RMSD and TM-score of every sample are printed. The model never recycles more
often than it was trained to (``model.n_recycles`` of its config), and an input too large for the memory at hand
is refused before any work.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import gemmi
import numpy as np
import torch

from .config import ConfigError, ModelConfig, section_from_dict
from .data import MmcifError, load_mmcif, token_features
from .data.prepare import MMCIF_SUFFIXES, entry_id
from .data.residue_constants import ONE_TO_INDEX, RESTYPES, THREE_TO_ONE, UNK
from .metrics import structure_metrics
from .model import MiniOF3, build_model
from .model.memory import available_bytes, inference_bytes
from .training.checkpoint import CheckpointError, candidate_checkpoints, read_config, read_file, read_state
from .training.run_folder import check_writable

SEQUENCE_LETTERS = set(RESTYPES) | {"X"}     # X: an unknown residue (UNK)
ONE_TO_THREE = {one: three for three, one in THREE_TO_ONE.items()}
CHAIN_NAMES = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


@dataclass
class Query:
    """What to predict: per-token features ``[N]`` (and the truth for an mmCIF input) plus chain names."""
    name: str
    features: dict[str, np.ndarray]
    chain_names: list[str]
    has_truth: bool


def read_fasta(path: Path) -> list[tuple[str, str]]:
    """``[(header, sequence)]`` of a FASTA file; raises ValueError naming the file and the bad record."""
    records: list[tuple[str, list[str]]] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(";"):
            continue
        if line.startswith(">"):
            records.append((line[1:].strip(), []))
        elif not records:
            raise ValueError(f"{path}: line {number} comes before the first '>' header; not a FASTA file?")
        else:
            records[-1][1].append(line.replace(" ", ""))
    out = []
    for header, lines in records:
        sequence = "".join(lines).upper().rstrip("*")
        if not sequence:
            raise ValueError(f"{path}: record {header!r} has no sequence")
        bad = sorted(set(sequence) - SEQUENCE_LETTERS)
        if bad:
            raise ValueError(f"{path}: record {header!r} has characters {''.join(bad)!r} that are not residues (the "
                             f"20 amino-acid letters, and X for an unknown one)")
        out.append((header, sequence))
    if not out:
        raise ValueError(f"{path}: no FASTA record (a record starts with a '>' header line)")
    return out


def fasta_query(path: Path) -> Query:
    """Features of the chains of a FASTA file: one chain per record, identical sequences share an entity."""
    records = read_fasta(path)
    if len(records) > len(CHAIN_NAMES):
        raise ValueError(f"{path}: {len(records)} records; at most {len(CHAIN_NAMES)} chains are supported")
    entities: dict[str, int] = {}
    copies: dict[int, int] = {}
    columns: dict[str, list] = {k: [] for k in ("restype", "residue_index", "asym_id", "entity_id", "sym_id")}
    for asym, (_, sequence) in enumerate(records):
        entity = entities.setdefault(sequence, len(entities))
        sym = copies.get(entity, 0)
        copies[entity] = sym + 1
        n = len(sequence)
        columns["restype"] += [ONE_TO_INDEX.get(c, UNK) for c in sequence]
        columns["residue_index"] += range(1, n + 1)
        columns["asym_id"] += [asym] * n
        columns["entity_id"] += [entity] * n
        columns["sym_id"] += [sym] * n
    features = {k: np.asarray(v, dtype=np.int64) for k, v in columns.items()}
    n = len(features["restype"])
    features.update(token_mask=np.ones(n, bool), resolved=np.zeros(n, bool), cb_resolved=np.zeros(n, bool),
                    ca=np.zeros((n, 3), np.float32), cb=np.zeros((n, 3), np.float32))
    return Query(path.name.split(".")[0], features, list(CHAIN_NAMES[: len(records)]), has_truth=False)


def mmcif_query(path: Path) -> Query:
    """Features of every token of an mmCIF entry (parsed and cleaned as for training), with its coordinates."""
    structure = load_mmcif(path)
    features = token_features(structure, np.arange(structure.n_tokens))
    return Query(structure.pdb_id or path.name.split(".")[0], features, list(structure.chain_ids), has_truth=True)


def read_query(path: str | Path) -> Query:
    """An mmCIF or FASTA input, told apart by suffix, else by a leading '>'."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such input file")
    if path.name.lower().endswith(MMCIF_SUFFIXES):
        return mmcif_query(path)
    return fasta_query(path)


def load_model(checkpoint: str | Path, device: torch.device, prefer: str = "best",
               say=lambda line: print(line, file=sys.stderr)) -> tuple[MiniOF3, Path, dict]:
    """The model of a checkpoint (run folder: best, else latest; or its latest with ``prefer="latest"``) with its EMA
    weights, in eval mode. In a run folder, a checkpoint with a damaged file is skipped (``say`` tells which and
    why) for the next one in that order; a damaged checkpoint folder named alone raises CheckpointError.

    Returns (model, checkpoint folder, trainer state)."""
    from safetensors.torch import load_file

    for info in candidate_checkpoints(checkpoint, prefer=prefer):
        try:
            if info.damage:
                raise CheckpointError(info.damage)
            cfg: ModelConfig = section_from_dict("model", read_config(info.path).get("model", {}))
            model = build_model(cfg)
            try:
                model.load_state_dict(read_file(info.path / "model.safetensors", load_file), strict=True)
            except RuntimeError as err:                  # a config.yaml cut short still parses, with defaults
                first = str(err).strip().splitlines()[0][:160]
                raise CheckpointError(f"{info.path / 'config.yaml'} does not describe the weights beside it "
                                      f"({first})") from None
            ema = info.path / "ema.safetensors"
            if ema.is_file():
                missing, unexpected = model.load_state_dict(read_file(ema, load_file), strict=False)
                buffers = {name for name, _ in model.named_buffers()}
                if unexpected or set(missing) - buffers:
                    raise ValueError(f"{ema}: does not match the model (missing {missing[:3]}, unexpected "
                                     f"{unexpected[:3]})")
            return model.to(device).eval(), info.path, read_state(info.path)
        except CheckpointError as err:
            if info.path == Path(checkpoint):
                raise
            say(f"predict: skipped checkpoint {info.path.name}: {err}")
    raise CheckpointError(f"{checkpoint}: no readable checkpoint (each skipped above)")


def output_name(out: Path, input_path: Path) -> str:
    """The name of an input's outputs in ``out``: its file name without suffix, preceded by as many of its folder
    names as tell it from another input predicted into ``out`` before (``<name>.json`` records the input)."""
    source = input_path.resolve()
    name = entry_id(source)
    for folder in (None, *(p.name for p in source.parents if p.name)):
        name = name if folder is None else f"{folder}_{name}"
        record = out / f"{name}.json"
        if not record.is_file():
            return name
        try:
            if json.loads(record.read_text()).get("input") == str(source):
                return name
        except (OSError, ValueError):
            continue
    return name


def check_outputs(out: Path, name: str, samples: int, overwrite: bool) -> None:
    """Refuse (ValueError) to replace earlier outputs of the same input unless ``overwrite``."""
    existing = [p for p in (out / f"{name}.json", *(out / f"{name}_rank{k}.cif" for k in range(1, samples + 1)))
                if p.exists()]
    if existing and not overwrite:
        raise ValueError(f"{existing[0]} exists (an earlier prediction of this input); --overwrite replaces it, or "
                         f"--out names another folder")


def check_memory(cfg: ModelConfig, n_tokens: int, samples: int, device: torch.device) -> None:
    """Refuse (ValueError) an input whose prediction cannot fit the memory at hand."""
    need, have = inference_bytes(cfg, n_tokens, samples, device), available_bytes(device)
    if have is not None and need > have:
        raise ValueError(f"{n_tokens} residues need at least {need / 2 ** 30:.1f} GiB on {device.type} for "
                         f"{samples} samples, {have / 2 ** 30:.1f} GiB is available: predict fewer residues (a domain "
                         f"or a chain), fewer --samples, or on a GPU")


def to_batch(features: dict[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(v))[None].to(device) for k, v in features.items()}


def write_mmcif(path: Path, name: str, features: dict[str, np.ndarray], chain_names: list[str], coords: np.ndarray,
                plddt: np.ndarray) -> None:
    """One CA atom per token at ``coords [N, 3]`` with ``plddt [N]`` as B-factor, as an mmCIF file (gemmi), with
    one entity per distinct chain sequence (``entity_id``) and its full sequence."""
    structure = gemmi.Structure()
    structure.name = name
    model = gemmi.Model("1")
    sequences: dict[int, list[str]] = {}
    subchains: dict[int, list[str]] = {}
    for asym, chain_name in enumerate(chain_names):
        chain = gemmi.Chain(chain_name)
        tokens = np.flatnonzero(features["asym_id"] == asym)
        entity = int(features["entity_id"][tokens[0]])
        subchains.setdefault(entity, []).append(chain_name)
        names = []
        for i in tokens:
            restype = int(features["restype"][i])
            names.append(ONE_TO_THREE[RESTYPES[restype]] if restype < len(RESTYPES) else "UNK")
            residue = gemmi.Residue()
            residue.name, residue.subchain = names[-1], chain_name
            residue.seqid = gemmi.SeqId(int(features["residue_index"][i]), " ")
            residue.label_seq = int(features["residue_index"][i])
            residue.entity_id, residue.entity_type = str(entity + 1), gemmi.EntityType.Polymer
            atom = gemmi.Atom()
            atom.name, atom.element = "CA", gemmi.Element("C")
            atom.pos = gemmi.Position(*map(float, coords[i]))
            atom.occ, atom.b_iso = 1.0, float(plddt[i])
            residue.add_atom(atom)
            chain.add_residue(residue)
        sequences.setdefault(entity, names)
        model.add_chain(chain)
    structure.add_model(model)
    for entity, names in sorted(sequences.items()):
        record = gemmi.Entity(str(entity + 1))
        record.entity_type, record.polymer_type = gemmi.EntityType.Polymer, gemmi.PolymerType.PeptideL
        record.subchains, record.full_sequence = subchains[entity], names
        structure.entities.append(record)
    groups = gemmi.MmcifOutputGroups(True, cell=False, symmetry=False)
    structure.make_mmcif_document(groups).write_file(str(path))


def predict(checkpoint: str | Path, input_path: str | Path, out: str | Path | None = None, *,
            recycles: int | None = None, steps: int | None = None, samples: int = 5, seed: int = 0,
            device: str | None = None, overwrite: bool = False) -> list[dict]:
    """Sample, rank by mean pLDDT, write the mmCIF files and score them; returns one row per sample, best first
    (rank, sample, plddt, file, and lddt_ca, rmsd, tm_score ... when the input holds the true structure)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    query = read_query(input_path)
    if out is not None:
        check_writable(out, "--out")
    model, folder, state = load_model(checkpoint, dev)
    trained = model.cfg.n_recycles
    if recycles is not None and recycles > trained:
        raise ValueError(f"--recycles {recycles}: this model was trained with at most {trained} recycles "
                         f"(model.n_recycles of {folder}); more would feed untrained recycling projections")
    recycles = trained if recycles is None else recycles
    steps = model.cfg.sampling_steps if steps is None else steps
    n_tokens = len(query.features["restype"])
    check_memory(model.cfg, n_tokens, samples, dev)
    out = Path(out) if out is not None else folder.parent.parent / "predictions"     # <run>/predictions
    check_writable(out, "--out")
    name = output_name(out, Path(input_path))
    check_outputs(out, name, samples, overwrite)
    coords, plddt, rows = sample_ranked(model, query, dev, recycles=recycles, steps=steps, samples=samples, seed=seed)
    print(f"checkpoint {folder} (step {state.get('step')}, EMA weights); {query.name}: {len(query.chain_names)} "
          f"chain(s), {n_tokens} residues; {samples} samples, {steps} steps, {recycles} recycles")
    for row in rows:
        path = out / f"{name}_rank{row['rank']}.cif"
        k = row["sample"]
        write_mmcif(path, query.name, query.features, query.chain_names, coords[k].numpy(), plddt[k].numpy())
        row["file"] = str(path)
    record = {"input": str(Path(input_path).resolve()), "checkpoint": str(folder), "step": state.get("step"),
              "recycles": recycles, "steps": steps, "seed": seed, "rows": rows}
    (out / f"{name}.json").write_text(json.dumps(record, indent=1))
    print(format_table(rows))
    return rows


def sample_ranked(model: MiniOF3, query: Query, device: torch.device, *, recycles: int, steps: int, samples: int,
                  seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """Sample ``samples`` structures of ``query`` and rank them by mean pLDDT.

    Returns coords [K, N, 3], plddt [K, N] (CPU, float32) and one row per sample, best first: rank, sample (index
    into coords), plddt, and when the query holds the true structure its :func:`structure_metrics`.
    """
    batch = to_batch(query.features, device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        result = model.sample(batch, n_recycles=recycles, steps=steps, samples=samples, generator=generator)
    coords = result["coords"][0].float()                                       # [K, N, 3] on the device
    plddt = result["plddt"][0].float().cpu()                                   # [K, N]
    order = torch.argsort(plddt.mean(-1), descending=True).tolist()
    logits = result["distogram_logits"][0].float()                             # [N, N, bins]
    truth = {key: torch.from_numpy(v).to(device) for key, v in query.features.items()} if query.has_truth else None
    rows = []
    for rank, k in enumerate(order, 1):
        row = {"rank": rank, "sample": k, "plddt": float(plddt[k].mean())}
        if truth is not None:        # computed where the prediction lies: seconds on a CPU for 2,000 tokens
            row.update(structure_metrics(coords[k], truth["ca"], truth["resolved"], truth["asym_id"],
                                         truth["entity_id"], truth["sym_id"], distogram_logits=logits,
                                         true_cb=truth["cb"]))
        rows.append(row)
    return coords.cpu(), plddt, rows


def format_table(rows: list[dict]) -> str:
    """The ranked samples as an aligned text table."""
    columns = [("rank", "rank", "d"), ("sample", "sample", "d"), ("pLDDT", "plddt", ".1f")]
    if "lddt_ca" in rows[0]:
        columns += [("lDDT-Ca", "lddt_ca", ".3f"), ("RMSD(A)", "rmsd", ".2f"), ("TM-score", "tm_score", ".3f")]
    columns.append(("file", "file", "s"))
    lines = ["  ".join(f"{title:>8}" if fmt != "s" else title for title, _, fmt in columns)]
    for row in rows:
        lines.append("  ".join(f"{format(row[key], fmt):>8}" if fmt != "s" else row[key] for _, key, fmt in columns))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mini_of3.predict", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a run folder (its best, else latest, checkpoint) or a checkpoint folder")
    parser.add_argument("input", help="an mmCIF file (scored against its structure) or a FASTA file")
    parser.add_argument("--out", default=None, help="output folder (default: the run folder's predictions/)")
    parser.add_argument("--recycles", type=int, default=None, help="trunk recycles (default: model.n_recycles)")
    parser.add_argument("--steps", type=int, default=None, help="diffusion steps (default: model.sampling_steps)")
    parser.add_argument("--samples", type=int, default=5, help="structures to sample (default: 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampler (default: 0)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    parser.add_argument("--overwrite", action="store_true", help="replace earlier outputs of the same input")
    args = parser.parse_args(argv)
    for name in ("recycles", "steps", "samples"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "recycles" else 1):
            parser.error(f"--{name} must be >= {0 if name == 'recycles' else 1}, got {value}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    try:
        predict(args.checkpoint, args.input, args.out, recycles=args.recycles, steps=args.steps,
                samples=args.samples, seed=args.seed, device=args.device, overwrite=args.overwrite)
    except (FileNotFoundError, ValueError, MmcifError, ConfigError) as err:
        print(f"predict: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
