"""The mmCIF data pipeline: fetch -> ``load_mmcif`` (parse + cleanup) -> prepared ``.npz`` cache -> crop -> features.

numpy, gemmi and biopython only, except ``dataset`` (torch ``Dataset``, sampler, collate, loaders). The command-line
modules (``fetch``, ``prepare``) and the torch side are imported on first use of one of their names, so that
``python -m mini_of3.data.prepare`` runs its module once and starts without torch.
"""
from importlib import import_module

from .crop import (AF3_CROP_WEIGHTS, Crop, crop_contiguous, crop_rng, crop_spatial, crop_spatial_interface,
                   crop_structure, interface_tokens, nearest_tokens)
from .manifest import ManifestRow, load_prepared, read_manifest
from .mmcif import load_mmcif
from .structure import MmcifError, Structure
from .tokens import token_features

_LAZY = {
    "FetchError": "fetch", "fetch_ids": "fetch",
    "ensure_offline_entries": "offline", "fetch_offline_package": "offline",
    "prepare_data": "prepare", "prepare_folder": "prepare",
    "DataLoaders": "dataset", "EpochSampler": "dataset", "ProteinDataset": "dataset", "build_dataloaders": "dataset",
    "collate": "dataset", "is_validation": "dataset", "resolve_validation": "dataset", "sample_weights": "dataset",
    "select_entries": "dataset",
}

__all__ = [
    "AF3_CROP_WEIGHTS", "Crop", "ManifestRow", "MmcifError", "Structure", "crop_contiguous", "crop_rng",
    "crop_spatial", "crop_spatial_interface", "crop_structure", "interface_tokens", "load_mmcif", "load_prepared",
    "nearest_tokens", "read_manifest", "token_features", *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
