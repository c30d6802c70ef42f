"""One tree of validated dataclasses for a whole run: loaded from YAML, overridden by ``key=value``, saved with the run.

Every module receives only its own section (``cfg.data``, ``cfg.model`` ...), never the whole tree. Each field
carries its own check beside it (pydantic does the typing and the bounds; ``Expected`` words the message where the
bound alone would not say enough), and a bad value is one :class:`ConfigError` line naming the key, the value and
what is expected. The key names used by scripts and docs (docs/design.md) are fixed: ``seed``, ``wandb``,
``data.root``, ``data.cache_dir``, ``data.val_ids``, ``data.crop_size``, ``data.num_workers``, ``model.n_blocks``,
``model.c_s``, ``model.c_z``, ``model.n_recycles``, ``model.tri_attn_backend``, ``model.tri_mul_backend``,
``model.tri_attn_activation``, ``trainer.max_steps``, ``trainer.out_dir``, ``trainer.resume``,
``trainer.checkpoint_every``, ``trainer.val_every``, ``trainer.compile``.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.dataclasses import dataclass

from .model.kernel_choice import TRANSITION_BACKENDS, TRI_ATTN_ACTIVATIONS, TRI_ATTN_BACKENDS, TRI_MUL_BACKENDS


class ConfigError(ValueError):
    """A bad key or value in a config file or a ``key=value`` override; the message is one clear line."""


class Expected(str):
    """The words for what a field expects, where its bounds alone would not say it (``Annotated`` metadata)."""


class Invalid(ValueError):
    """A check across fields failed: ``key`` (within its section) got ``value``, expected ``expected``; or, with
    ``expected`` None, ``key`` is only named and the message says the rest."""

    def __init__(self, key: str, value: Any, expected: str | None, message: str | None = None) -> None:
        super().__init__(message or f"{key}: got {value!r}, expected {expected}")
        self.key, self.value, self.expected, self.message = key, value, expected, message


def _split_commas(value: Any) -> Any:
    """``a,b,c`` on the command line is the list [a, b, c] (YAML reads it as one string); ``auto`` stays a word."""
    return [v for v in value.split(",") if v] if isinstance(value, str) and value != "auto" else value


def _word_not_bool(value: Any) -> Any:
    """YAML 1.1 reads an unquoted no/off as False: take accelerate's word "no" back."""
    return "no" if value is False else value


def _check(ok, expected: str):
    """An ``AfterValidator`` raising ``expected`` (the words for the message) unless ``ok(value)``."""
    def check(value):
        if not ok(value):
            raise ValueError(expected)
        return value
    return AfterValidator(check)


PositiveInt = Annotated[int, Field(ge=1)]
Count = Annotated[int, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1), Expected("a fraction in [0, 1]")]
OpenFraction = Annotated[float, Field(ge=0, lt=1), Expected("a number in [0, 1)")]
Ids = Annotated[list[str], BeforeValidator(_split_commas)]
Floats = Annotated[list[float], BeforeValidator(_split_commas)]

_SECTION = ConfigDict(extra="forbid", coerce_numbers_to_str=True, allow_inf_nan=False)


DEFAULT_DATA_ROOT = "data/mmcif"             # the one folder the demonstration entries are downloaded into


@dataclass(config=_SECTION)
class DataConfig:
    root: str = DEFAULT_DATA_ROOT            # folder of raw mmCIF files (prepared into cache_dir on first use)
    cache_dir: str = "data/cache"            # prepared .npz folder (manifest.tsv, skipped.tsv)
    offline_package: bool = True             # the default root empty -> fetch the mdanalysistests entries into it
    val_ids: Annotated[list[str] | Literal["auto"], BeforeValidator(_split_commas),
                       Expected("a list of entry ids, or auto")] = field(default_factory=list)
                                             # validation entries (never trained on, unless train_ids names them
                                             # too), or auto: chosen from the prepared folder by size and identity
                                             # clustering (mini_of3/data/validation_split.py), the same every time
    val_auto_count: PositiveInt = 6          # val_ids auto: how many entries, spanning small to large ...
    val_auto_max_tokens: PositiveInt = 768   # ... up to this many tokens
    train_ids: Ids = field(default_factory=list)  # when set, train on these entries only; one named here and in
                                             # val_ids is trained on too, on purpose (a fit check: bench fit)
    val_after: str | None = None             # else: entries released after this date (YYYY-MM-DD) validate
    train_eval_ids: Annotated[list[str] | Literal["auto"], BeforeValidator(_split_commas),
                              Expected("a list of entry ids, or auto")] = field(default_factory=list)
                                             # training entries also scored at every validation, as the validation
                                             # entries are (logged as split "train_eval"); auto: the smallest, the
                                             # median and the largest training entry
    val_identity_cut: Annotated[Fraction, Expected("a fraction in [0, 1] or null")] | None = 0.4
                                             # training entries with a chain more identical than this to a validation
                                             # chain are left out (AF3, OpenFold3: 0.4); None: split by entry id only
    crop_size: PositiveInt = 256
    val_crop_size: PositiveInt | None = None  # validation crop; None: crop_size. A fixed size validates runs of
                                             # different training crops on the same tokens (python -m mini_of3.ablate)
    crop_weights: Annotated[Floats, _check(lambda w: len(w) == 3 and min(w) >= 0 and sum(w) > 0,
                                           "three non-negative numbers, not all zero")] = \
        field(default_factory=lambda: [0.2, 0.4, 0.4])             # contiguous, spatial, interface (AF3 SI 2.7)
    interface_distance: Positive = 15.0      # Angstrom, AF3 SI 2.7.2
    min_tokens: PositiveInt = 16
    max_tokens: PositiveInt | None = None
    max_resolution: Positive | None = 9.0    # Angstrom; None keeps all (NMR has no resolution)
    min_resolved_fraction: Fraction = 0.0    # entries with fewer of their tokens resolved are left out (5KC1: 0.19)
    methods: Ids = field(default_factory=list)   # empty keeps every experimental method
    sample_weighting: Literal["uniform", "length", "chains"] = "chains"
    samples_per_epoch: PositiveInt | None = None  # examples per epoch over all ranks; None: one per training entry
    batch_size: PositiveInt = 1
    pad_to_crop: bool = False                # training batches padded to crop_size tokens: one input shape for
                                             # every step, as CUDA graphs need (trainer.compile_mode=reduce-overhead
                                             # records new graphs for each new shape)
    num_workers: Count = 2
    parse_timeout_s: Positive = 120.0        # per mmCIF file when preparing data.root into data.cache_dir

    def __post_init__(self) -> None:
        named = [] if self.val_ids == "auto" else self.val_ids
        scored = [] if self.train_eval_ids == "auto" else self.train_eval_ids
        shared = sorted({v.upper() for v in named} & {t.upper() for t in scored})
        if shared:
            raise Invalid("train_eval_ids", self.train_eval_ids,
                          f"training entries, none of data.val_ids (both name {', '.join(shared)})")
        both = sorted({v.upper() for v in named} & {t.upper() for t in self.train_ids})
        if both and self.val_identity_cut is not None:
            raise Invalid("val_identity_cut", self.val_identity_cut,
                          f"null when data.train_ids and data.val_ids share entries ({', '.join(both)}): training on "
                          f"the validation entries on purpose (a fit check) leaves nothing to train on once their "
                          f"homologues are removed")


@dataclass(config=_SECTION)
class ModelConfig:
    n_blocks: PositiveInt = 2
    c_s: PositiveInt = 384
    c_z: PositiveInt = 128
    n_heads_tri: PositiveInt = 4
    c_hidden_tri: Annotated[int, _check(lambda d: d in (16, 32, 64, 128), "one of 16, 32, 64, 128")] = 32
    n_heads_single: PositiveInt = 16
    c_hidden_mul: PositiveInt = 128
    transition_factor: PositiveInt = 4
    pair_dropout: OpenFraction = 0.25
    n_recycles: Count = 3                    # training samples 0..n_recycles per step; inference uses n_recycles
    tri_attn_backend: Literal[TRI_ATTN_BACKENDS] = "auto"     # auto: our kernel where it takes the call, else torch
    tri_mul_backend: Literal[TRI_MUL_BACKENDS] = "auto"       # (mini_of3.model.kernel_choice), for every op
    tri_attn_activation: Literal[TRI_ATTN_ACTIVATIONS] = "softmax"
    tri_attn_fused_gate: bool = True          # our backends apply the gate inside the kernels (false: in PyTorch)
    tri_attn_split_ds: bool = False           # true: our kernel's backward splits dS into bf16 hi + lo (dq, dk
                                              # errors 1.7e-3, not 2.4e-3 as cuEquivariance's); 36 ms more per
                                              # step at crop 768 on the H100
    pair_transition_backend: Literal[TRANSITION_BACKENDS] = "auto"
    checkpointing: bool = True               # activation checkpointing per Pairformer block
    checkpoint_blocks: Count | None = None   # with checkpointing: the first k Pairformer blocks recompute their
                                             # activations in the backward, the others keep them (null: all)
    distogram_bins: Annotated[int, Field(ge=2)] = 64
    distogram_min: NonNegative = 2.0
    distogram_max: Positive = 22.0
    plddt_bins: Annotated[int, Field(ge=2)] = 50
    diffusion_blocks: PositiveInt = 2
    diffusion_heads: PositiveInt = 8
    c_token: PositiveInt = 256               # diffusion transformer width
    sigma_data: Positive = 16.0
    noise_p_mean: float = -1.2               # training noise levels sigma = sigma_data exp(p_mean + p_std N(0, 1)),
    noise_p_std: Positive = 1.5              # AF3 SI 3.7.1 (median sigma 4.8 A)
    diffusion_samples: PositiveInt = 48      # noise levels / augmentations per structure per step, as AF3 (with 8, a
                                             # model overfit on 1L2Y denoised sigma >= 160 A to 4.5 A RMSD, with 32
                                             # to 1)
    sampling_steps: PositiveInt = 50
    plddt_rollout_steps: PositiveInt = 20    # gradient-free mini-rollout whose sample trains the pLDDT head, as AF3
                                             # (10 steps sample visibly worse structures than 20 or more)

    def __post_init__(self) -> None:
        for width, heads in (("c_s", "n_heads_single"), ("c_token", "diffusion_heads")):
            if getattr(self, width) % getattr(self, heads):
                raise Invalid(width, getattr(self, width), None,
                              f"model.{width}={getattr(self, width)} must be a multiple of "
                              f"model.{heads}={getattr(self, heads)}")
        if self.checkpoint_blocks is not None and self.checkpoint_blocks > self.n_blocks:
            raise Invalid("checkpoint_blocks", self.checkpoint_blocks, f"null or 0..model.n_blocks={self.n_blocks}")
        if self.distogram_max <= self.distogram_min:
            raise Invalid("distogram_max", self.distogram_max, f"> model.distogram_min={self.distogram_min}")


@dataclass(config=_SECTION)
class LossConfig:
    # total = distogram * L_distogram + diffusion * (L_mse + smooth_lddt * L_smooth_lddt) + plddt * L_plddt,
    # with L_mse the sigma-weighted aligned MSE; smooth lDDT is part of AF3's L_diffusion (SI eq. 6)
    distogram: NonNegative = 1.0
    diffusion: NonNegative = 4.0
    smooth_lddt: NonNegative = 1.0
    plddt: NonNegative = 0.01


@dataclass(config=_SECTION)
class OptimConfig:
    """AdamW with AF3's schedule (SI 5.4): linear warm-up to ``lr`` over ``warmup_steps``, then x ``decay_factor``
    every ``decay_every`` steps; gradients clipped to norm ``grad_clip`` (0 = no clipping); EMA of the weights."""
    lr: Positive = 1.8e-3                    # AF3 SI 5.4
    betas: Annotated[Floats, _check(lambda b: len(b) == 2 and all(0 <= x < 1 for x in b),
                                    "two numbers in [0, 1)")] = field(default_factory=lambda: [0.9, 0.95])
    eps: Positive = 1e-8
    weight_decay: NonNegative = 0.0
    warmup_steps: Count = 1000
    decay_every: PositiveInt = 50_000
    decay_factor: Annotated[float, Field(gt=0, le=1), Expected("a number in (0, 1]")] = 0.95
    grad_clip: Annotated[NonNegative, Expected(">= 0 (0: no clipping)")] = 10.0
    ema_decay: OpenFraction = 0.999          # reached after a warm-up: min(ema_decay, (1 + n) / (10 + n)) at update n


def _resume_target(value: str) -> str:
    if value in ("auto", "never", "force") or Path(value).is_dir():
        return value
    raise ValueError("auto, never, force, or an existing run folder or checkpoint folder")


@dataclass(config=_SECTION)
class TrainerConfig:
    """The loop: steps, run folder, resume, checkpoints, validation, precision (trainer.py)."""
    max_steps: Count = 200
    max_minutes: Positive | None = None      # also stop once the training steps (not validation, checkpoints or
                                             # torch.compile's compiling) have taken this long, with a final
                                             # validation and checkpoint; kept on resume
    out_dir: Annotated[str, _check(lambda s: bool(s.strip()), "a folder name")] = "runs/default"
    resume: Annotated[str, AfterValidator(_resume_target)] = "auto"   # auto | never | force | PATH (a run folder
                                             # or one checkpoint folder). auto resumes the run folder's own run and
                                             # stops if its checkpoints were written under another definition (seed,
                                             # model, data, losses, optimiser); force and PATH go on with the new
                                             # values (training/run_folder.py)
    checkpoint_every: PositiveInt = 50
    keep_last: PositiveInt = 2               # complete checkpoints kept, plus the best by validation lDDT
    val_every: PositiveInt = 50
    val_samples: PositiveInt = 1             # structures sampled per validation entry; the top by pLDDT is scored
    val_sampling_steps: PositiveInt | None = None    # EDM steps when validating; None: model.sampling_steps
    log_every: PositiveInt = 1               # wandb and the progress bar (log.jsonl gets every step)
    mixed_precision: Annotated[Literal["no", "bf16", "fp16"], BeforeValidator(_word_not_bool)] = "no"
    grad_accum: PositiveInt = 1
    compile: bool = False
    compile_mode: Literal["default", "reduce-overhead"] = "default"   # torch.compile's mode for the compiled
                                             # blocks and sampler step: reduce-overhead replays them as CUDA graphs
    max_nonfinite: PositiveInt = 5           # stop after this many non-finite losses in a row (no checkpoint is
                                             # written while they last)
    loss_spike_factor: Annotated[float, Field(gt=1)] | None = 10.0   # warn (once per episode) when a loss exceeds
                                             # this many times the median of the last 50; null: never
    stall_timeout_s: Annotated[Positive, Expected("> 0 seconds")] = 1800.0   # a collective that waits longer than
                                             # this ends the run with a message


@dataclass(config=_SECTION)
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
# loading, overriding, saving; pydantic's errors as one line

_ERROR_WORDS = {"int_parsing": "an integer", "int_from_float": "an integer", "int_type": "an integer",
                "float_parsing": "a number", "float_type": "a number", "finite_number": "a finite number",
                "bool_parsing": "true or false", "bool_type": "true or false", "string_type": "a string",
                "list_type": "a list", "dataclass_type": "a mapping of keys",
                "dataclass_args_type": "a mapping of keys"}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _field_type(section: type, key: str) -> Any:
    """The annotation of ``key`` in ``section`` (a config dataclass), or None."""
    fields = getattr(section, "__pydantic_fields__", {})
    return fields[key].rebuild_annotation() if key in fields else None


def _section_at(path: tuple[str, ...]) -> type | None:
    """The config dataclass that holds the last key of ``path`` (``("data", "crop_size")`` -> DataConfig)."""
    node = Config
    for key in path[:-1]:
        annotation = _field_type(node, key)
        if annotation is None or not dataclasses.is_dataclass(annotation):
            return None
        node = annotation
    return node


def _field_path(loc: tuple[str, ...]) -> tuple[str, ...]:
    """``loc`` up to its first key that is not a section (pydantic adds union members and list indices after it)."""
    node: Any = Config
    for i, key in enumerate(loc):
        annotation = _field_type(node, key)
        if annotation is None or not dataclasses.is_dataclass(annotation):
            return loc[: i + 1]
        node = annotation
    return loc


def _unwrap(annotation: Any) -> tuple[Any, bool, list[str]]:
    """(the bare type, whether None is allowed, the Expected words) of a field's annotation."""
    optional, words = False, []
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            words += [m for m in annotation.__metadata__ if isinstance(m, Expected)]
            annotation = annotation.__origin__
        elif origin in (typing.Union, types.UnionType):
            options = [a for a in typing.get_args(annotation) if a is not type(None)]
            optional = optional or len(options) < len(typing.get_args(annotation))
            annotation = options[0]
        else:
            return annotation, optional, words


def _shown(value: Any, bare: Any) -> Any:
    """``value`` as the field's type shows it (an integer given for a float field reads 1.0)."""
    if bare is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typing.get_origin(bare) is list and typing.get_args(bare) == (float,) and isinstance(value, list):
        return [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
    return value


def _one_line(error: dict, prefix: tuple[str, ...]) -> str:
    """One pydantic error (of ``Config``, or of its section ``prefix``) as ``key: got value, expected what``."""
    loc = _field_path(prefix + tuple(str(part) for part in error["loc"]))
    key, kind, ctx = ".".join(loc), error["type"], error.get("ctx") or {}
    if kind == "unexpected_keyword_argument":
        section = _section_at(loc)
        known = sorted(getattr(section, "__pydantic_fields__", {}))
        close = difflib.get_close_matches(loc[-1], known, n=1)
        hint = f"did you mean {'.'.join(loc[:-1] + (close[0],))!r}? " if close else ""
        return f"unknown config key {key!r} ({hint}known here: {', '.join(known)})"
    if isinstance(ctx.get("error"), Invalid):
        invalid = ctx["error"]
        key = ".".join(loc + (invalid.key,))
        return invalid.message or f"{key}: got {invalid.value!r}, expected {invalid.expected}"
    section = _section_at(loc)
    bare, optional, words = _unwrap(_field_type(section, loc[-1])) if section else (None, False, [])
    if words:
        expected = words[-1]
    elif kind in _BOUNDS:
        limit = next(iter(ctx.values()))
        expected = f"{_BOUNDS[kind]} {limit:g}"
    elif kind == "literal_error":
        expected = "one of " + ", ".join(map(str, typing.get_args(bare)))
    elif kind == "value_error":
        expected = str(ctx["error"])
    else:
        expected = _ERROR_WORDS.get(kind, error["msg"])
    if optional and "null" not in expected:
        expected += " or null"
    return f"{key}: got {_shown(error['input'], bare)!r}, expected {expected}"


def _build(cls: type, values: dict, prefix: tuple[str, ...] = ()) -> Any:
    """``cls(**values)``, validated; the first problem raises ConfigError as one line."""
    if not isinstance(values, dict):
        raise ConfigError(f"{'.'.join(prefix) or 'config'}: expected a mapping of keys, got {values!r}")
    try:
        return cls(**values)
    except ValidationError as err:
        raise ConfigError(_one_line(err.errors()[0], prefix)) from None


def _set(tree: dict, dotted: str, value: Any) -> None:
    """Put ``value`` at ``a.b.c`` in the nested dict ``tree``."""
    *parents, last = dotted.split(".")
    for key in parents:
        node = tree.get(key)
        tree = tree.setdefault(key, {}) if isinstance(node, dict) or node is None else {key: node}
    tree[last] = value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Build a Config from defaults, then a YAML file, then ``key=value`` overrides; raise ConfigError on bad input."""
    tree: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        try:
            tree = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {str(err).splitlines()[0]}") from None
        if not isinstance(tree, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys")
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError:
            value = raw
        _set(tree, key.strip(), value)
    return _build(Config, tree)


def config_to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def config_from_dict(values: dict) -> Config:
    return _build(Config, values)


def section_from_dict(name: str, values: dict) -> Any:
    """One section (``"model"``, ``"data"`` ...) of a saved config dict, its keys and types checked: what a tool that
    needs only that section (e.g. ``predict`` reading a checkpoint's ``config.yaml``) reads."""
    return _build(_field_type(Config, name), values, (name,))


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
