"""Training data for the model: a torch ``Dataset`` over a prepared folder, its sampler, collate and loaders.

Examples are pure functions of ``(seed, epoch, index)``: ``dataset[(index, epoch)]`` always gives the same crop, and
:class:`EpochSampler` gives a deterministic stream of ``(index, epoch)`` per epoch, which a rank slices as
``stream[rank::world_size]`` and which resumes at any position; so a run restored from a checkpoint sees exactly the
examples it would have seen.
"""
from __future__ import annotations

import functools
import signal
import warnings
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Literal, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ..config import DataConfig
from .crop import crop_rng, crop_structure
from .homology import ChainSequence, Homologue, IdentityCache, entry_chains, find_homologues
from .manifest import ManifestRow, load_prepared, read_manifest
from .tokens import FEATURE_NAMES, token_features
from .validation_split import choose_validation

Split = Literal["train", "val", "all"]


# ----------------------------------------------------------------------------------------------------------------
# which entries: filters and the train/validation split


def is_validation(row: ManifestRow, cfg: DataConfig) -> bool:
    """An entry validates when named in ``cfg.val_ids`` (file id or PDB id, any case) or released after
    ``cfg.val_after``; it is then never trained on."""
    if is_named(row, cfg.val_ids):
        return True
    return bool(cfg.val_after and row.release_date and row.release_date > cfg.val_after)


def filter_reason(row: ManifestRow, cfg: DataConfig) -> str | None:
    """Why ``row`` fails the filters of ``cfg`` (length, resolution, resolved fraction, method), or None when it
    passes."""
    if row.tokens < cfg.min_tokens:
        return f"{row.tokens} tokens < min_tokens {cfg.min_tokens}"
    if cfg.max_tokens is not None and row.tokens > cfg.max_tokens:
        return f"{row.tokens} tokens > max_tokens {cfg.max_tokens}"
    if cfg.max_resolution is not None and row.resolution is not None and row.resolution > cfg.max_resolution:
        return f"resolution {row.resolution} A > max_resolution {cfg.max_resolution}"
    if row.resolved_fraction < cfg.min_resolved_fraction:
        return f"{row.resolved_fraction:.2f} of its tokens resolved < min_resolved_fraction {cfg.min_resolved_fraction}"
    if cfg.methods:
        allowed = {m.upper() for m in cfg.methods}
        if not allowed & set(row.method.upper().split(";")):
            return f"method {row.method!r} not in {sorted(allowed)}"
    return None


def is_named(row: ManifestRow, ids: Sequence[str]) -> bool:
    """``row`` is one of ``ids`` (file id or PDB id, any case)."""
    wanted = {v.upper() for v in ids}
    return row.id.upper() in wanted or row.pdb_id.upper() in wanted


def select_entries(rows: Sequence[ManifestRow], cfg: DataConfig, split: Split) -> list[ManifestRow]:
    """The entries of ``split``: those passing the filters, then the validation ones (``val``), the others
    (``train``) or both (``all``). With ``cfg.train_ids``, ``train`` is the entries named there, validation ones
    included (a fit check trains on its validation entries on purpose)."""
    if split not in ("train", "val", "all"):
        raise ValueError(f"split must be 'train', 'val' or 'all', got {split!r}")
    kept = [r for r in rows if filter_reason(r, cfg) is None]
    if split == "all":
        return kept
    if split == "train" and cfg.train_ids:
        return [r for r in kept if is_named(r, cfg.train_ids)]
    return [r for r in kept if is_validation(r, cfg) == (split == "val")]


def resolve_validation(prepared: str | Path, cfg: DataConfig) -> DataConfig:
    """``cfg`` with ``val_ids: auto`` replaced by the entries :func:`.validation_split.choose_validation` picks from
    the prepared folder (identities cached there); any other ``cfg`` as it is."""
    if cfg.val_ids != "auto":
        return cfg
    prepared = Path(prepared)
    kept = select_entries(read_manifest(prepared), replace(cfg, val_ids=[], val_after=None), "all")
    chains = {r.id: _chains(prepared, r) for r in kept}
    return replace(cfg, val_ids=choose_validation(kept, chains, cfg, IdentityCache(prepared)))


def validation_homologues(prepared: Path, rows: Sequence[ManifestRow], train: Sequence[ManifestRow],
                          cfg: DataConfig) -> list[Homologue]:
    """The entries of ``train`` with a chain more than ``cfg.val_identity_cut`` identical to a chain of a validation
    entry of ``rows`` (AF3's 40 % cut by default; :mod:`.homology`), each with its most identical pair; identities are
    cached in ``prepared``."""
    val = select_entries(rows, cfg, "val")
    if cfg.val_identity_cut is None or not val or not train:
        return []
    val_chains = [c for r in val for c in _chains(prepared, r)]
    return find_homologues([_chains(prepared, r) for r in train], val_chains, cfg.val_identity_cut,
                           IdentityCache(prepared))


def _chains(prepared: Path, row: ManifestRow) -> list[ChainSequence]:
    """The chain sequences of a prepared entry, one per entity."""
    return entry_chains(load_prepared(prepared / row.npz), row.id)


def sample_weights(rows: Sequence[ManifestRow], how: Literal["uniform", "length", "chains"]) -> np.ndarray:
    """Relative sampling weight of each entry: uniform, by token count, or by chain count (a simple stand-in for
    AF3 SI 2.5.1, which samples chains and interfaces, so that entries with more chains come up more often)."""
    if how == "uniform":
        w = np.ones(len(rows))
    elif how == "length":
        w = np.array([r.tokens for r in rows], dtype=np.float64)
    elif how == "chains":
        w = np.array([r.chains for r in rows], dtype=np.float64)
    else:
        raise ValueError(f"sample weighting must be 'uniform', 'length' or 'chains', got {how!r}")
    return w / w.sum() if len(w) else w


# ----------------------------------------------------------------------------------------------------------------
# the dataset


class ProteinDataset(Dataset):
    """Cropped examples of the entries of a prepared folder (see :func:`select_entries` for ``split``); ``train``
    also leaves out the entries homologous to a validation entry (:func:`validation_homologues`, listed in
    ``removed`` and by :meth:`removal_report`). Crops have ``cfg.crop_size`` tokens, those of ``val``
    ``cfg.val_crop_size`` when set (so that runs with different training crops validate on the same tokens).

    ``dataset[index]`` uses the current ``epoch`` (:meth:`set_epoch`); ``dataset[(index, epoch)]`` names it. Each
    item is a dict of tensors (:mod:`.tokens`) plus ``id``, ``pdb_id`` and ``crop_method``.
    """

    def __init__(self, prepared: str | Path, cfg: DataConfig, split: Split = "train", seed: int = 0,
                 rows: Sequence[ManifestRow] | None = None, interface_cache: int = 1024):
        self.prepared = Path(prepared)
        cfg = resolve_validation(self.prepared, cfg)
        self.cfg = cfg
        self.split = split
        self.seed = seed
        rows = read_manifest(self.prepared) if rows is None else rows
        self.rows = select_entries(rows, cfg, split)
        self.removed: list[Homologue] = []
        if split == "train":
            self.removed = validation_homologues(self.prepared, rows, self.rows, cfg)
            homologous = {h.train.entry for h in self.removed}
            self.rows = [r for r in self.rows if r.id not in homologous]
        named = {"val": ("val_ids", cfg.val_ids), "train": ("train_ids", cfg.train_ids)}.get(split)
        if named is not None:
            found = {r.id.upper() for r in self.rows} | {r.pdb_id.upper() for r in self.rows}
            missing = sorted(v for v in named[1] if v.upper() not in found)
            if missing:
                warnings.warn(f"{prepared}: {named[0]} {missing} are not among the entries that pass the filters")
        self.crop_size = cfg.val_crop_size if split == "val" and cfg.val_crop_size is not None else cfg.crop_size
        self.epoch = 0
        self._interface: OrderedDict[int, np.ndarray] = OrderedDict()   # per-worker cache of interface masks
        self._interface_cache = interface_cache

    def __len__(self) -> int:
        return len(self.rows)

    def removal_report(self) -> list[str]:
        """One line per training entry left out as a homologue of a validation chain (which chain, what identity)."""
        return [h.line() for h in self.removed]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def weights(self) -> np.ndarray:
        return sample_weights(self.rows, self.cfg.sample_weighting)

    def structure(self, index: int):
        return load_prepared(self.prepared / self.rows[index].npz)

    def __getitem__(self, item: int | tuple[int, int]) -> dict:
        index, epoch = item if isinstance(item, tuple) else (item, self.epoch)
        if not 0 <= index < len(self.rows):
            raise IndexError(f"index {index} out of range for {len(self.rows)} entries")
        row = self.rows[index]
        structure = self.structure(index)
        crop = crop_structure(structure, self.crop_size, crop_rng(self.seed, epoch, index),
                              weights=self.cfg.crop_weights, interface=self._interface.get(index),
                              distance=self.cfg.interface_distance)
        if crop.interface is not None and index not in self._interface:
            self._interface[index] = crop.interface
            if len(self._interface) > self._interface_cache:
                self._interface.popitem(last=False)
        out: dict = {name: torch.from_numpy(value) for name, value in token_features(structure, crop.indices).items()}
        out.update(id=row.id, pdb_id=row.pdb_id, crop_method=crop.method)
        return out


def collate(batch: list[dict], n_tokens: int | None = None) -> dict:
    """Stack examples, padding every token feature to the longest in the batch, or to ``n_tokens`` when given: 0
    for values, False for masks (``token_mask`` marks the real tokens). Strings become lists."""
    if not batch:
        raise ValueError("collate: empty batch")
    n_max = max(int(item["token_mask"].shape[0]) for item in batch)
    if n_tokens is not None:
        if n_max > n_tokens:
            raise ValueError(f"collate: an example has {n_max} tokens, more than n_tokens={n_tokens}")
        n_max = n_tokens
    out: dict = {}
    for name in FEATURE_NAMES:
        first = batch[0][name]
        padded = torch.zeros((len(batch), n_max, *first.shape[1:]), dtype=first.dtype)
        for b, item in enumerate(batch):
            padded[b, : item[name].shape[0]] = item[name]
        out[name] = padded
    for name in batch[0]:
        if name not in out:
            out[name] = [item[name] for item in batch]
    return out


# ----------------------------------------------------------------------------------------------------------------
# the sampler


class EpochSampler(Sampler):
    """A deterministic, resumable, rank-sharded stream of ``(index, epoch)`` pairs.

    Per epoch the stream (:meth:`stream`) is a permutation for uniform weights, else a weighted draw with replacement
    (like ``WeightedRandomSampler``), from ``numpy.random.default_rng((seed, epoch))``, padded by wrapping to a
    multiple of ``world_size``; rank ``r`` takes ``stream[r::world_size]``, so ranks never share an example of the
    permutation and all get the same count. ``set_epoch(epoch, start)`` sets where the next ``__iter__`` begins:
    store ``{"epoch": e, "start": examples this rank consumed}`` in a checkpoint and call
    ``load_state_dict`` to continue exactly there (``state_dict()`` returns what was last set).
    """

    def __init__(self, weights: np.ndarray, seed: int, *, num_samples: int | None = None, rank: int = 0,
                 world_size: int = 1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        weights = np.asarray(weights, dtype=np.float64)
        if len(weights) == 0 or weights.min() < 0 or weights.sum() <= 0:
            raise ValueError(f"weights must be non-negative and not all zero, got {len(weights)} weights")
        self.p = weights / weights.sum()
        self.uniform = bool(np.allclose(self.p, self.p[0]))
        self.seed, self.rank, self.world_size = seed, rank, world_size
        n = num_samples if num_samples is not None else len(weights)
        self.total = -(-n // world_size) * world_size        # a multiple of world_size
        self.epoch, self.start = 0, 0

    def stream(self, epoch: int) -> np.ndarray:
        """``[total]`` entry indices of one epoch, for all ranks."""
        rng = np.random.default_rng((self.seed, epoch))
        n = len(self.p)
        if self.uniform:
            order = rng.permutation(n)
            return np.resize(order, self.total)                # wraps around to fill a multiple of world_size
        return rng.choice(n, size=self.total, replace=True, p=self.p)

    def indices(self, epoch: int) -> np.ndarray:
        """This rank's ``[total / world_size]`` entry indices of ``epoch``."""
        return self.stream(epoch)[self.rank :: self.world_size]

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "start": self.start, "seed": self.seed, "total": self.total,
                "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed", self.seed) != self.seed or state.get("total", self.total) != self.total:
            raise ValueError(f"sampler state is for seed {state.get('seed')} and {state.get('total')} samples per "
                             f"epoch, this sampler has seed {self.seed} and {self.total}")
        self.set_epoch(int(state["epoch"]), int(state["start"]))

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch
        for i in self.indices(epoch)[self.start :]:
            yield int(i), epoch

    def __len__(self) -> int:
        return self.total // self.world_size - self.start


# ----------------------------------------------------------------------------------------------------------------
# loaders


@dataclass
class DataLoaders:
    train: DataLoader
    val: DataLoader | None
    train_sampler: EpochSampler
    val_real: int = 0           # how many leading batches of ``val`` hold this rank's entries (the rest are padding)
    train_eval: DataLoader | None = None    # data.train_eval_ids, batched as ``val`` (validation crop, padded shards)
    train_eval_real: int = 0

    def close(self) -> None:
        """Stop the worker processes of both loaders (their persistent iterators are dropped; a later ``iter``
        starts new workers). Workers ignore SIGINT and SIGTERM (:func:`_worker_init`), so they end only when told:
        multiprocessing's exit handler would otherwise SIGTERM them and wait forever."""
        for loader in (self.train, self.val, self.train_eval):
            iterator = getattr(loader, "_iterator", None)   # DataLoader keeps its persistent workers' iterator here
            if iterator is not None and hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()
            if loader is not None:
                loader._iterator = None


def _worker_init(_: int) -> None:
    """Set up a loader worker: one thread, and deaf to SIGINT and SIGTERM. A scheduler (SLURM, Kubernetes,
    ``timeout``) and Ctrl-C signal every process of the job; the main process decides how the run stops and shuts its
    workers down when it exits, so a worker that died of the signal would only cut the stop short."""
    torch.set_num_threads(1)      # numpy work per example; threads would fight over the cores the GPU feed needs
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)


def make_loader(dataset: ProteinDataset, sampler, batch_size: int, num_workers: int, *,
                batch_sampler=None, n_tokens: int | None = None) -> DataLoader:
    """A loader over ``sampler`` in batches of ``batch_size``, or over the given batches (``batch_sampler``); with
    ``n_tokens``, every batch is padded to that many tokens (:func:`collate`)."""
    batching = {"batch_sampler": batch_sampler} if batch_sampler is not None else \
        {"batch_size": batch_size, "sampler": sampler}
    return DataLoader(dataset, **batching, collate_fn=functools.partial(collate, n_tokens=n_tokens),
                      num_workers=num_workers,
                      persistent_workers=num_workers > 0, pin_memory=torch.cuda.is_available(),
                      prefetch_factor=4 if num_workers > 0 else None,
                      worker_init_fn=_worker_init if num_workers > 0 else None)


def validation_batches(n: int, batch_size: int, rank: int, world_size: int) -> tuple[list[list[tuple[int, int]]], int]:
    """(batches of ``(index, 0)``, how many of them are real) of validation entries ``range(n)`` for one rank.

    The rank's entries are ``range(rank, n, world_size)`` (with the epoch-0 crop), in batches of ``batch_size``;
    then batches of entry 0 pad the list to the largest rank's count, so that every rank runs the same number of
    batches (under FSDP each forward is a collective: a rank with a batch fewer leaves the others waiting forever).
    The padding batches are run and not scored.
    """
    mine = [(i, 0) for i in range(rank, n, world_size)]
    batches = [mine[k : k + batch_size] for k in range(0, len(mine), batch_size)]
    most = -(-(-(-n // world_size)) // batch_size)     # ceil(ceil(n / world_size) / batch_size)
    return batches + [[(0, 0)]] * (most - len(batches)), len(batches)


def build_dataloaders(cfg: DataConfig, prepared: str | Path, seed: int, rank: int = 0,
                      world_size: int = 1) -> DataLoaders:
    """Train and validation loaders over a prepared folder for one rank.

    Train: :class:`EpochSampler` (weights from ``cfg.sample_weighting``); call ``loaders.train_sampler.set_epoch``
    before each epoch (the dataset's crops follow the epoch given with each index). Validation: each rank takes
    ``val[rank::world_size]`` with the epoch-0 crop, so every validation pass sees the same examples, padded with
    batches that are run but not scored so that all ranks run the same number (:func:`validation_batches`;
    ``val_real`` counts the real ones); None when no entry validates.
    """
    asked = cfg.val_ids or cfg.val_after
    cfg = resolve_validation(prepared, cfg)
    train = ProteinDataset(prepared, cfg, "train", seed)
    if len(train) == 0:
        raise ValueError(f"{prepared}: no training entries left after the filters and the validation split"
                         + (f" ({len(train.removed)} removed as homologues of validation chains)" if train.removed
                            else ""))
    sampler = EpochSampler(train.weights(), seed, num_samples=cfg.samples_per_epoch, rank=rank, world_size=world_size)
    validation = ProteinDataset(prepared, cfg, "val", seed)
    if asked and not len(validation):
        raise ValueError(f"{prepared}: the validation set is empty (data.val_ids={cfg.val_ids or []}, data.val_after="
                         f"{cfg.val_after}): name entries of this folder, or data.val_ids=auto")
    val, val_real = _evaluation_loader(validation, cfg, rank, world_size)
    train_eval, train_eval_real = None, 0
    if cfg.train_eval_ids == "auto":                    # the smallest, median and largest training entry
        by_size = sorted((r for r in train.rows if not is_validation(r, cfg)), key=lambda r: (r.tokens, r.id))
        chosen = sorted({by_size[i].id for i in (0, len(by_size) // 2, -1)}) if by_size else []
        cfg = replace(cfg, train_eval_ids=chosen)
    if cfg.train_eval_ids:
        train_eval, train_eval_real = _evaluation_loader(training_evaluation_set(prepared, cfg, train, seed), cfg,
                                                         rank, world_size)
    train_loader = make_loader(train, sampler, cfg.batch_size, cfg.num_workers,
                               n_tokens=cfg.crop_size if cfg.pad_to_crop else None)
    return DataLoaders(train=train_loader, val=val,
                       train_sampler=sampler, val_real=val_real, train_eval=train_eval,
                       train_eval_real=train_eval_real)


def _evaluation_loader(dataset: ProteinDataset, cfg: DataConfig, rank: int, world_size: int
                       ) -> tuple[DataLoader | None, int]:
    """A validation-style loader (:func:`validation_batches`) over ``dataset`` and its count of real batches; None
    for an empty dataset."""
    if not len(dataset):
        return None, 0
    batches, real = validation_batches(len(dataset), cfg.batch_size, rank, world_size)
    return make_loader(dataset, None, cfg.batch_size, min(cfg.num_workers, 1), batch_sampler=batches), real


def training_evaluation_set(prepared: str | Path, cfg: DataConfig, train: ProteinDataset, seed: int
                            ) -> ProteinDataset:
    """The entries of ``cfg.train_eval_ids`` as validation examples (the validation crop, epoch 0); each must be an
    entry ``train`` trains on, else ValueError naming it and why it is not."""
    named = replace(cfg, val_ids=list(cfg.train_eval_ids), train_ids=[], train_eval_ids=[], val_after=None,
                    val_identity_cut=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # a missing one is an error below, not a warning
        dataset = ProteinDataset(prepared, named, "val", seed)
    trained = {r.id.upper() for r in train.rows} | {r.pdb_id.upper() for r in train.rows}
    removed = {h.train.entry.upper() for h in train.removed}
    found = {r.id.upper() for r in dataset.rows} | {r.pdb_id.upper() for r in dataset.rows}
    for entry in cfg.train_eval_ids:
        if entry.upper() not in trained or entry.upper() not in found:
            why = ("left out of training as a homologue of a validation chain" if entry.upper() in removed else
                   "not a training entry (a validation entry, filtered out, or not in the prepared folder)")
            raise ValueError(f"data.train_eval_ids: {entry} is {why}")
    return dataset
