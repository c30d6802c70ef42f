"""One dataclass tree for a whole run: loaded from YAML, overridden by ``key=value``, validated, saved with the run.

Every module receives only its own section (``cfg.data``, ``cfg.model`` ...), never the whole tree.
The key names used by scripts and docs (DESIGN.md, Training) are fixed: ``seed``, ``wandb``, ``data.root``,
``data.cache_dir``, ``data.val_ids``, ``data.crop_size``, ``data.num_workers``, ``model.n_blocks``, ``model.c_s``,
``model.c_z``, ``model.n_recycles``, ``model.tri_attn_backend``, ``model.tri_mul_backend``,
``model.tri_attn_activation``, ``trainer.max_steps``, ``trainer.out_dir``, ``trainer.resume``,
``trainer.checkpoint_every``, ``trainer.val_every``, ``trainer.compile``.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml


class ConfigError(ValueError):
    """A bad key or value in a config file or a ``key=value`` override; the message is one clear line."""


@dataclass
class DataConfig:
    root: str = "data/mmcif"                 # folder of raw mmCIF files (prepared into cache_dir on first use)
    cache_dir: str = "data/cache"            # prepared .npz folder (manifest.tsv, skipped.tsv)
    offline_package: bool = True             # root empty -> fetch the mdanalysistests entries into root first
    val_ids: list[str] = field(default_factory=list)   # explicit validation entries (never trained on, unless
                                             # train_ids names them too)
    train_ids: list[str] = field(default_factory=list)  # when set, train on these entries only; one named here and in
                                             # val_ids is trained on too, on purpose (a fit check: bench fit)
    val_after: str | None = None             # else: entries released after this date (YYYY-MM-DD) validate
    train_eval_ids: list[str] = field(default_factory=list)  # training entries also scored at every validation,
                                             # as the validation entries are (logged as split "train_eval")
    val_identity_cut: float | None = 0.4     # training entries with a chain more identical than this to a validation
                                             # chain are left out (AF3, OpenFold3: 0.4); None: split by entry id only
    crop_size: int = 256
    val_crop_size: int | None = None         # validation crop; None: crop_size. A fixed size validates runs of
                                             # different training crops on the same tokens (python -m mini_of3.ablate)
    crop_weights: list[float] = field(default_factory=lambda: [0.2, 0.4, 0.4])  # contiguous, spatial, interface
    interface_distance: float = 15.0         # Angstrom, AF3 SI 2.7.2
    min_tokens: int = 16
    max_tokens: int | None = None
    max_resolution: float | None = 9.0       # Angstrom; None keeps all (NMR has no resolution)
    min_resolved_fraction: float = 0.0       # entries with fewer of their tokens resolved are left out (5KC1: 0.19)
    methods: list[str] = field(default_factory=list)  # empty keeps every experimental method
    sample_weighting: Literal["uniform", "length", "chains"] = "chains"
    samples_per_epoch: int | None = None     # examples per epoch over all ranks; None: one per training entry
    batch_size: int = 1
    pad_to_crop: bool = False                # training batches padded to crop_size tokens: one input shape for
                                             # every step, as CUDA graphs need (trainer.compile_mode=reduce-overhead
                                             # records new graphs for each new shape)
    num_workers: int = 2
    parse_timeout_s: float = 120.0           # per mmCIF file when preparing data.root into data.cache_dir


@dataclass
class ModelConfig:
    n_blocks: int = 2
    c_s: int = 384
    c_z: int = 128
    n_heads_tri: int = 4
    c_hidden_tri: int = 32
    n_heads_single: int = 16
    c_hidden_mul: int = 128
    transition_factor: int = 4
    pair_dropout: float = 0.25
    n_recycles: int = 3                      # training samples 0..n_recycles per step; inference uses n_recycles
    tri_attn_backend: Literal["auto", "mini_of3", "torch", "trifast", "cueq", "of3_triton"] = "auto"
    tri_mul_backend: Literal["auto", "mini_of3", "torch", "cueq"] = "auto"   # auto = torch
    tri_attn_activation: Literal["softmax", "sigmoid"] = "softmax"
    tri_attn_fused_gate: bool = True          # our backends apply the gate inside the kernels (false: in PyTorch)
    tri_attn_split_ds: bool = False           # true: our kernel's backward splits dS into bf16 hi + lo (dq, dk
                                              # errors 1.7e-3, not 2.4e-3 as cuEquivariance's); 36 ms more per
                                              # step at crop 768 (H100, step_crop768_50ce36b_splitds_h100.json)
    pair_transition_backend: Literal["auto", "mini_of3", "torch"] = "auto"   # auto = our kernel on CUDA
    checkpointing: bool = True               # activation checkpointing per Pairformer block
    checkpoint_blocks: int | None = None     # with checkpointing: the first k Pairformer blocks recompute their
                                             # activations in the backward, the others keep them (null: all)
    distogram_bins: int = 64
    distogram_min: float = 2.0
    distogram_max: float = 22.0
    plddt_bins: int = 50
    diffusion_blocks: int = 2
    diffusion_heads: int = 8
    c_token: int = 256                       # diffusion transformer width
    sigma_data: float = 16.0
    noise_p_mean: float = -1.2               # training noise levels sigma = sigma_data exp(p_mean + p_std N(0, 1)),
    noise_p_std: float = 1.5                 # AF3 SI 3.7.1 (median sigma 4.8 A)
    diffusion_samples: int = 48              # noise levels / augmentations per structure per step, as AF3 (with 8, a
                                             # model overfit on 1L2Y denoised sigma >= 160 A to 4.5 A RMSD, with 32 to 1)
    sampling_steps: int = 50
    plddt_rollout_steps: int = 20            # gradient-free mini-rollout whose sample trains the pLDDT head, as AF3
                                             # (10 steps sample visibly worse structures than 20 or more)


@dataclass
class LossConfig:
    # total = distogram * L_distogram + diffusion * (L_mse + smooth_lddt * L_smooth_lddt) + plddt * L_plddt,
    # with L_mse the sigma-weighted aligned MSE; smooth lDDT is part of AF3's L_diffusion (SI eq. 6)
    distogram: float = 1.0
    diffusion: float = 4.0
    smooth_lddt: float = 1.0
    plddt: float = 0.01


@dataclass
class OptimConfig:
    """AdamW with AF3's schedule (SI 5.4): linear warm-up to ``lr`` over ``warmup_steps``, then x ``decay_factor``
    every ``decay_every`` steps; gradients clipped to norm ``grad_clip`` (0 = no clipping); EMA of the weights."""
    lr: float = 1.8e-3                       # AF3 SI 5.4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 1000
    decay_every: int = 50_000
    decay_factor: float = 0.95
    grad_clip: float = 10.0
    ema_decay: float = 0.999                 # reached after a warm-up: min(ema_decay, (1 + n) / (10 + n)) at update n


@dataclass
class TrainerConfig:
    """The loop: steps, run folder, resume, checkpoints, validation, precision (trainer.py)."""
    max_steps: int = 200
    max_minutes: float | None = None         # also stop once the training steps (not validation, checkpoints or
                                             # torch.compile's compiling) have taken this long, with a final
                                             # validation and checkpoint; kept on resume
    out_dir: str = "runs/default"
    resume: str = "auto"                     # auto | never | PATH (a run folder or one checkpoint folder)
    checkpoint_every: int = 50
    keep_last: int = 2                       # complete checkpoints kept, plus the best by validation lDDT
    val_every: int = 50
    val_samples: int = 1                     # structures sampled per validation entry; the top by pLDDT is scored
    val_sampling_steps: int | None = None    # EDM steps when validating; None: model.sampling_steps
    log_every: int = 1                       # wandb and the progress bar (log.jsonl gets every step)
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    grad_accum: int = 1
    compile: bool = False
    compile_mode: Literal["default", "reduce-overhead"] = "default"   # torch.compile's mode for the compiled
                                             # blocks and sampler step: reduce-overhead replays them as CUDA graphs
    max_nonfinite: int = 5                   # stop after this many non-finite losses in a row
    stall_timeout_s: float = 1800.0          # a collective that waits longer than this ends the run with a message


@dataclass
class Config:
    seed: int = 0
    wandb: bool = True
    wandb_project: str = "mini_of3"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)


# ----------------------------------------------------------------------------------------------------------------
# loading, overriding, validating, saving

_YAML_BOOL_WORDS = {False: ("no", "off", "false"), True: ("yes", "on", "true")}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Convert ``value`` (from YAML or a command-line string) to the annotated type ``tp`` or raise ConfigError."""
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in options:
                return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key}: got {value!r}, expected {tp}")
    if origin is Literal:
        allowed = get_args(tp)
        if isinstance(value, bool):   # YAML 1.1 reads an unquoted no/yes/off/on as a boolean: take the word back
            value = next((word for word in _YAML_BOOL_WORDS[value] if word in allowed), value)
        if value not in allowed:
            raise ConfigError(f"{key}: got {value!r}, expected one of {', '.join(map(str, allowed))}")
        return value
    if origin is list:
        (item_type,) = get_args(tp)
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip().startswith("[") else [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: got {value!r}, expected a list")
        return [_coerce(v, item_type, key) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{key}: got {value!r}, expected true or false")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: got {value!r}, expected an integer")
        try:
            as_float = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: got {value!r}, expected an integer") from None
        if as_float != int(as_float):
            raise ConfigError(f"{key}: got {value!r}, expected an integer")
        return int(as_float)
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: got {value!r}, expected a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: got {value!r}, expected a number") from None
    if tp is str:
        if value is None or isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: got {value!r}, expected a string")
        return str(value)
    raise ConfigError(f"{key}: unsupported type {tp}")


def _set(node: Any, dotted: str, value: Any, full_key: str) -> None:
    head, _, rest = dotted.partition(".")
    names = {f.name for f in dataclasses.fields(node)}
    if head not in names:
        close = difflib.get_close_matches(head, names, n=1)
        hint = f"did you mean {full_key[: len(full_key) - len(dotted)] + close[0]!r}? " if close else ""
        raise ConfigError(f"unknown config key {full_key!r} ({hint}known here: {', '.join(sorted(names))})")
    hints = get_type_hints(type(node))
    current = getattr(node, head)
    if dataclasses.is_dataclass(current):
        if rest:
            _set(current, rest, value, full_key)
            return
        if not isinstance(value, dict):
            raise ConfigError(f"{full_key}: expected a mapping of keys, got {value!r}")
        for sub_key, sub_value in value.items():
            _set(current, str(sub_key), sub_value, f"{full_key}.{sub_key}")
        return
    if rest:
        raise ConfigError(f"unknown config key {full_key!r} ({head!r} has no sub-keys)")
    setattr(node, head, _coerce(value, hints[head], full_key))


def _check(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: got {value!r}, expected {expected}")


def _validate(cfg: Config) -> None:
    """Check the values of every section; the first bad one raises ConfigError naming the key and the value."""
    d, m, o, t = cfg.data, cfg.model, cfg.optim, cfg.trainer
    _check(d.crop_size >= 1, "data.crop_size", d.crop_size, ">= 1")
    _check(d.val_crop_size is None or d.val_crop_size >= 1, "data.val_crop_size", d.val_crop_size, ">= 1 or null")
    _check(len(d.crop_weights) == 3 and all(w >= 0 for w in d.crop_weights) and sum(d.crop_weights) > 0,
           "data.crop_weights", d.crop_weights, "three non-negative numbers, not all zero")
    _check(0.0 <= d.min_resolved_fraction <= 1.0, "data.min_resolved_fraction", d.min_resolved_fraction,
           "a fraction in [0, 1]")
    _check(d.val_identity_cut is None or 0.0 <= d.val_identity_cut <= 1.0, "data.val_identity_cut",
           d.val_identity_cut, "a fraction in [0, 1] or null")
    shared = sorted({v.upper() for v in d.val_ids} & {t.upper() for t in d.train_eval_ids})
    _check(not shared, "data.train_eval_ids", d.train_eval_ids,
           f"training entries, none of data.val_ids (both name {', '.join(shared)})")
    both = sorted({v.upper() for v in d.val_ids} & {t.upper() for t in d.train_ids})
    _check(not both or d.val_identity_cut is None, "data.val_identity_cut", d.val_identity_cut,
           f"null when data.train_ids and data.val_ids share entries ({', '.join(both)}): training on the validation "
           f"entries on purpose (a fit check) leaves nothing to train on once their homologues are removed")
    _check(d.batch_size >= 1, "data.batch_size", d.batch_size, ">= 1")
    _check(d.num_workers >= 0, "data.num_workers", d.num_workers, ">= 0")
    _check(d.samples_per_epoch is None or d.samples_per_epoch >= 1, "data.samples_per_epoch", d.samples_per_epoch,
           ">= 1 or null")
    _check(m.n_blocks >= 1, "model.n_blocks", m.n_blocks, ">= 1")
    _check(m.c_s >= 1, "model.c_s", m.c_s, ">= 1")
    _check(m.c_z >= 1, "model.c_z", m.c_z, ">= 1")
    _check(m.n_recycles >= 0, "model.n_recycles", m.n_recycles, ">= 0")
    _check(m.c_hidden_tri in (16, 32, 64, 128), "model.c_hidden_tri", m.c_hidden_tri, "one of 16, 32, 64, 128")
    _check(0.0 <= m.pair_dropout < 1.0, "model.pair_dropout", m.pair_dropout, "a number in [0, 1)")
    _check(m.sampling_steps >= 1, "model.sampling_steps", m.sampling_steps, ">= 1")
    _check(m.noise_p_std > 0, "model.noise_p_std", m.noise_p_std, "> 0")
    _check(o.lr > 0, "optim.lr", o.lr, "> 0")
    _check(len(o.betas) == 2 and all(0.0 <= b < 1.0 for b in o.betas), "optim.betas", o.betas,
           "two numbers in [0, 1)")
    _check(o.eps > 0, "optim.eps", o.eps, "> 0")
    _check(o.weight_decay >= 0, "optim.weight_decay", o.weight_decay, ">= 0")
    _check(o.warmup_steps >= 0, "optim.warmup_steps", o.warmup_steps, ">= 0")
    _check(o.decay_every >= 1, "optim.decay_every", o.decay_every, ">= 1")
    _check(0.0 < o.decay_factor <= 1.0, "optim.decay_factor", o.decay_factor, "a number in (0, 1]")
    _check(o.grad_clip >= 0, "optim.grad_clip", o.grad_clip, ">= 0 (0: no clipping)")
    _check(0.0 <= o.ema_decay < 1.0, "optim.ema_decay", o.ema_decay, "a number in [0, 1)")
    _check(t.max_steps >= 0, "trainer.max_steps", t.max_steps, ">= 0")
    _check(t.max_minutes is None or t.max_minutes > 0, "trainer.max_minutes", t.max_minutes, "> 0 or null")
    _check(bool(t.out_dir.strip()), "trainer.out_dir", t.out_dir, "a folder name")
    _check(t.resume in ("auto", "never") or Path(t.resume).is_dir(), "trainer.resume", t.resume,
           "auto, never, or an existing run folder or checkpoint folder")
    _check(t.checkpoint_every >= 1, "trainer.checkpoint_every", t.checkpoint_every, ">= 1")
    _check(t.keep_last >= 1, "trainer.keep_last", t.keep_last, ">= 1")
    _check(t.val_every >= 1, "trainer.val_every", t.val_every, ">= 1")
    _check(t.val_samples >= 1, "trainer.val_samples", t.val_samples, ">= 1")
    _check(t.val_sampling_steps is None or t.val_sampling_steps >= 1, "trainer.val_sampling_steps",
           t.val_sampling_steps, ">= 1 or null")
    _check(t.log_every >= 1, "trainer.log_every", t.log_every, ">= 1")
    _check(t.grad_accum >= 1, "trainer.grad_accum", t.grad_accum, ">= 1")
    _check(t.max_nonfinite >= 1, "trainer.max_nonfinite", t.max_nonfinite, ">= 1")
    _check(t.stall_timeout_s > 0, "trainer.stall_timeout_s", t.stall_timeout_s, "> 0 seconds")


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build a Config from defaults, then a YAML file, then ``key=value`` overrides; raise ConfigError on bad input."""
    cfg = Config()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {str(err).splitlines()[0]}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys")
        for key, value in loaded.items():
            _set(cfg, str(key), value, str(key))
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError:
            value = raw
        _set(cfg, key.strip(), value, key.strip())
    _validate(cfg)
    return cfg


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def config_from_dict(values: dict) -> Config:
    cfg = Config()
    for key, value in values.items():
        _set(cfg, key, value, key)
    _validate(cfg)
    return cfg


def section_from_dict(name: str, values: dict) -> Any:
    """One section (``"model"``, ``"data"`` ...) of a saved config dict, its keys and types checked: what a tool that
    needs only that section (e.g. ``predict`` reading a checkpoint's ``config.yaml``) reads."""
    cfg = Config()
    _set(cfg, name, values, name)
    return getattr(cfg, name)


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
