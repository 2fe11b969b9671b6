"""Experiment configuration: frozen dataclasses filled from TOML and overrides.

``load(path, overrides=("model.d_model=128", ...)) -> Experiment``. No config file is
executed. Every field is validated in ``__post_init__``; a bad value raises
:class:`ConfigError` with one line naming the field, the value and what is valid.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from tfmjax.presets import PRESETS

FAMILIES = ("encoder_decoder", "decoder_only", "encoder_only")
POSITIONS = ("sinusoidal", "learned", "rope", "alibi", "relative", "none")
NORMS = ("layernorm", "rmsnorm")
NORM_POSITIONS = ("pre", "post")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu", "geglu_tanh")
PAIR_LAYOUTS = ("interleaved", "half_split")  # model.rope_layout, model.sinusoidal_layout
ATTENTION_IMPLS = ("auto", "reference", "xla", "blockwise", "pallas")
ATTENTIONS = ("softmax", "mla", "linear")  # model.attention: the self-attention system
FEATURE_MAPS = ("elu", "favor")  # model.feature_map of linear attention
DTYPES = ("float32", "bfloat16")
SCHEDULES = ("inverse_sqrt", "cosine", "linear", "constant", "wsd")
MESH_AXES = ("data", "fsdp", "tensor")  # mesh.data, mesh.fsdp, mesh.tensor, in this order
RULE_SETS = ("standard", "replicated")  # mesh.rules: see tfmjax.parallel.rules
EVAL_METRICS = ("exact_match", "token_accuracy", "loss", "perplexity", "bits_per_char")
LOWER_IS_BETTER = ("loss", "perplexity", "bits_per_char")
# Each enumeration above is the one list of names; the registries that implement them
# (tfmjax.models.FAMILIES, tfmjax.kernels.IMPLS, tfmjax.train.schedules, the evaluator's
# metrics) are checked against it in tests/test_registries.py.


class ConfigError(ValueError):
    """A configuration value is wrong; the message is one line that says how to fix it."""


def _require(ok: bool, field: str, value: Any, valid: str) -> None:
    if not ok:
        raise ConfigError(f"{field}={value!r} is invalid: {valid}")


def _one_of(field: str, value: Any, options: tuple) -> None:
    _require(value in options, field, value, f"must be one of {', '.join(map(str, options))}")


def _positive(section: str, obj: Any, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None:
            _require(value > 0, f"{section}.{name}", value, "must be > 0")


def _check_types(section: str, obj: Any) -> None:
    """Check every field against its annotation (int, float, bool, str, optional, dict)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value, hint = getattr(obj, f.name), hints[f.name]
        allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if value is None and type(None) in allowed:
            continue
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(obj, f.name, float(value))
            continue
        ok = any(
            isinstance(value, t) and not (t is int and isinstance(value, bool))
            for t in allowed
            if t is not type(None)
        )
        names = " or ".join("none" if t is type(None) else t.__name__ for t in allowed)
        _require(ok, f"{section}.{f.name}", value, f"must be {names}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture. Only ``tfmjax/models/`` reads this."""

    family: str = "encoder_decoder"
    vocab_size: int = 32
    d_model: int = 64
    num_heads: int = 4
    num_kv_heads: int | None = None
    head_dim: int | None = None
    scale_attention: bool = True
    d_ff: int = 256
    num_layers: int = 2
    num_decoder_layers: int | None = None
    max_len: int = 256
    position: str = "sinusoidal"
    sinusoidal_layout: str = "interleaved"
    position_offset: int = 0
    rope_base: float = 10000.0
    rope_layout: str = "interleaved"
    relative_buckets: int = 32
    relative_max_distance: int = 128
    norm: str = "layernorm"
    norm_position: str = "pre"
    norm_eps: float = 1e-5
    activation: str = "relu"
    use_bias: bool = True
    attention_bias: bool | None = None
    mlp_bias: bool | None = None
    tie_embeddings: bool = True
    scale_tied_output: bool = False
    scale_embeddings: bool = False
    type_vocab_size: int = 0
    embed_norm: bool = False
    per_side_embeddings: bool = False
    mlm_head: bool = False
    output_bias: bool = False
    dropout_rate: float = 0.0
    window: int | None = None
    attention_stride: int | None = None
    global_tokens: int = 0
    attention: str = "softmax"
    kv_rank: int | None = None
    q_rank: int | None = None
    rope_dim: int | None = None
    feature_map: str = "elu"
    num_features: int = 64
    attention_impl: str = "auto"
    scan_layers: bool = True
    remat: bool = False
    dtype: str = "float32"
    bos_id: int = 1

    def __post_init__(self):
        _check_types("model", self)
        _one_of("model.family", self.family, FAMILIES)
        _one_of("model.position", self.position, POSITIONS)
        _one_of("model.norm", self.norm, NORMS)
        _one_of("model.norm_position", self.norm_position, NORM_POSITIONS)
        _one_of("model.activation", self.activation, ACTIVATIONS)
        _one_of("model.rope_layout", self.rope_layout, PAIR_LAYOUTS)
        _one_of("model.sinusoidal_layout", self.sinusoidal_layout, PAIR_LAYOUTS)
        _one_of("model.attention_impl", self.attention_impl, ATTENTION_IMPLS)
        _one_of("model.attention", self.attention, ATTENTIONS)
        _one_of("model.feature_map", self.feature_map, FEATURE_MAPS)
        _one_of("model.dtype", self.dtype, DTYPES)
        _positive(
            "model",
            self,
            "vocab_size",
            "d_model",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "d_ff",
            "num_layers",
            "num_decoder_layers",
            "max_len",
            "rope_base",
            "relative_buckets",
            "relative_max_distance",
            "norm_eps",
            "attention_stride",
            "kv_rank",
            "q_rank",
            "num_features",
        )
        _require(self.global_tokens >= 0, "model.global_tokens", self.global_tokens, "must be >= 0")
        self._check_attention_system()
        if self.head_dim is None:
            _require(
                self.d_model % self.num_heads == 0,
                "model.d_model",
                self.d_model,
                f"must be divisible by model.num_heads={self.num_heads} (or set model.head_dim)",
            )
        _require(
            self.num_heads % self.kv_heads == 0,
            "model.num_heads",
            self.num_heads,
            f"must be divisible by model.num_kv_heads={self.kv_heads}",
        )
        if self.position == "rope":
            _require(
                self.head_width % 2 == 0,
                "model.head_dim",
                self.head_width,
                "RoPE rotates pairs of features, so the head width must be even",
            )
        if self.position == "relative":
            _require(
                self.attention_impl in ("auto", "xla", "reference"),
                "model.attention_impl",
                self.attention_impl,
                "cannot add the dense T5 relative bias of "
                "model.position='relative': use 'auto', 'xla' or 'reference'",
            )
        _require(
            self.type_vocab_size >= 0, "model.type_vocab_size", self.type_vocab_size, "must be >= 0"
        )
        _require(
            self.position_offset >= 0, "model.position_offset", self.position_offset, "must be >= 0"
        )
        if self.per_side_embeddings:
            _require(
                self.family == "encoder_decoder",
                "model.per_side_embeddings",
                True,
                "only encoder_decoder models have two sides",
            )
        if self.mlm_head:
            _require(
                self.activation in ("relu", "gelu", "gelu_tanh", "silu"),
                "model.mlm_head",
                self.mlm_head,
                f"needs a non-gated model.activation (relu, gelu, gelu_tanh, silu), "
                f"not {self.activation!r}",
            )
        _require(
            0.0 <= self.dropout_rate < 1.0,
            "model.dropout_rate",
            self.dropout_rate,
            "must be in [0, 1)",
        )
        if self.window is not None:
            _require(self.window >= 0, "model.window", self.window, "must be >= 0 or none")
        _require(
            0 <= self.bos_id < self.vocab_size,
            "model.bos_id",
            self.bos_id,
            f"must be a token id in [0, model.vocab_size={self.vocab_size})",
        )
        if self.family != "encoder_decoder":
            _require(
                self.num_decoder_layers is None,
                "model.num_decoder_layers",
                self.num_decoder_layers,
                "only encoder_decoder models have a separate decoder",
            )

    def _check_attention_system(self) -> None:
        """MLA and linear attention: the options that fit each (one ConfigError line)."""
        if self.attention == "mla":
            _require(
                self.num_kv_heads in (None, self.num_heads),
                "model.num_kv_heads",
                self.num_kv_heads,
                "model.attention='mla' compresses keys and values into its latent "
                "(model.kv_rank) instead of sharing heads: leave num_kv_heads unset",
            )
            if self.position == "rope":
                _require(
                    self.mla_rope_dim % 2 == 0 and 0 < self.mla_rope_dim < self.head_width,
                    "model.rope_dim",
                    self.rope_dim,
                    f"must be even and in (0, head width {self.head_width})",
                )
            else:
                _require(
                    self.rope_dim in (None, 0),
                    "model.rope_dim",
                    self.rope_dim,
                    "decoupled RoPE features need model.position='rope'",
                )
        elif self.kv_rank is not None or self.q_rank is not None or self.rope_dim is not None:
            unused = "kv_rank" if self.kv_rank is not None else "q_rank"
            unused = "rope_dim" if self.rope_dim is not None else unused
            _require(
                False, f"model.{unused}", getattr(self, unused), "applies to model.attention='mla'"
            )
        if self.attention == "linear":
            _require(
                self.position not in ("alibi", "relative"),
                "model.position",
                self.position,
                "linear attention has no score matrix to add a position bias to: use "
                "sinusoidal, learned, rope or none",
            )
            for name in ("window", "attention_stride"):
                _require(
                    getattr(self, name) is None,
                    f"model.{name}",
                    getattr(self, name),
                    "sparse patterns apply to softmax and mla attention, not linear",
                )
            _require(
                self.global_tokens == 0,
                "model.global_tokens",
                self.global_tokens,
                "sparse patterns apply to softmax and mla attention, not linear",
            )

    @property
    def latent_kv_rank(self) -> int:
        """MLA's latent width ``R`` (default: 4 head widths, DeepSeek-V2's ratio)."""
        return 4 * self.head_width if self.kv_rank is None else self.kv_rank

    @property
    def mla_rope_dim(self) -> int:
        """MLA's decoupled RoPE features per head (default: half the head width)."""
        if self.position != "rope":
            return 0
        return self.head_width // 2 if self.rope_dim is None else self.rope_dim

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def head_width(self) -> int:
        return self.d_model // self.num_heads if self.head_dim is None else self.head_dim

    @property
    def attention_uses_bias(self) -> bool:
        return self.use_bias if self.attention_bias is None else self.attention_bias

    @property
    def mlp_uses_bias(self) -> bool:
        return self.use_bias if self.mlp_bias is None else self.mlp_bias

    @property
    def decoder_layers(self) -> int:
        return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimiser and learning-rate schedule."""

    learning_rate: float = 1e-3
    schedule: str = "cosine"
    warmup_steps: int = 100
    end_learning_rate: float = 0.0
    decay_fraction: float = 0.1
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.98
    eps: float = 1e-9
    clip_norm: float | None = 1.0
    grad_accum_steps: int = 1
    label_smoothing: float = 0.0

    def __post_init__(self):
        _check_types("optim", self)
        _one_of("optim.schedule", self.schedule, SCHEDULES)
        _positive("optim", self, "learning_rate", "eps", "clip_norm", "grad_accum_steps")
        _require(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "must be >= 0")
        _require(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "must be >= 0")
        _require(
            0 <= self.end_learning_rate,
            "optim.end_learning_rate",
            self.end_learning_rate,
            "must be >= 0",
        )
        for name in ("b1", "b2", "label_smoothing", "decay_fraction"):
            value = getattr(self, name)
            _require(0.0 <= value < 1.0, f"optim.{name}", value, "must be in [0, 1)")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Which toy task, its parameters, and the batch size."""

    task: str = "reverse"
    task_params: dict = dataclasses.field(default_factory=dict)
    batch_size: int = 64
    eval_examples: int = 512

    def __post_init__(self):
        _check_types("data", self)
        _positive("data", self, "batch_size", "eval_examples")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The training run: length, seed, where it writes and how often."""

    steps: int = 1000
    seed: int = 0
    workdir: str = ""
    log_every: int = 50
    eval_every: int = 250
    checkpoint_every: int = 250
    keep_checkpoints: int = 3
    best_metric: str = "exact_match"
    tensorboard: bool = False
    init_from: str = ""

    def __post_init__(self):
        _check_types("train", self)
        _positive(
            "train",
            self,
            "steps",
            "log_every",
            "eval_every",
            "checkpoint_every",
            "keep_checkpoints",
        )
        _require(self.seed >= 0, "train.seed", self.seed, "must be >= 0")
        _one_of("train.best_metric", self.best_metric, EVAL_METRICS)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """How the run spreads over devices: a ``data x fsdp x tensor`` mesh and a rule set.

    ``-1`` (at most one axis) means "the devices the other axes leave". The default is one
    device. The mesh is not part of the model: a checkpoint restores onto any mesh.
    Whether the sizes fit the machine and the model is checked when the mesh is built
    (:func:`tfmjax.parallel.check_mesh`), where the device count is known.
    """

    data: int = 1
    fsdp: int = 1
    tensor: int = 1
    rules: str = "standard"

    def __post_init__(self):
        _check_types("mesh", self)
        sizes = {axis: getattr(self, axis) for axis in MESH_AXES}
        for axis, size in sizes.items():
            _require(size == -1 or size >= 1, f"mesh.{axis}", size, "must be >= 1, or -1")
        rest = [axis for axis, size in sizes.items() if size == -1]
        _require(
            len(rest) <= 1,
            f"mesh.{rest[-1] if rest else ''}",
            -1,
            f"only one mesh axis may be -1 (the rest of the devices); {', '.join(rest)} are",
        )
        _one_of("mesh.rules", self.rules, RULE_SETS)


SECTIONS = {
    "model": ModelConfig,
    "optim": OptimConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "mesh": MeshConfig,
}
# The sections that decide what a run computes; the mesh only decides where.
RUN_SECTIONS = ("model", "optim", "data", "train")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """Everything one run needs: its name, the four sections of the run and the mesh."""

    name: str = "experiment"
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)

    def __post_init__(self):
        k = self.optim.grad_accum_steps
        _require(
            self.data.batch_size % k == 0,
            "data.batch_size",
            self.data.batch_size,
            f"must be divisible by optim.grad_accum_steps={k} (each step splits the batch "
            "in k micro-batches)",
        )

    @property
    def workdir(self) -> str:
        return self.train.workdir or f"runs/{self.name}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def get_preset(name: str) -> ModelConfig:
    """The :class:`ModelConfig` of a preset name."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"model.preset={name!r} is unknown{hint}; presets: {', '.join(PRESETS)}")
    return ModelConfig(**PRESETS[name])


def preset(name: str, **overrides) -> ModelConfig:
    """A preset with some fields replaced, e.g. ``preset("tiny-gpt2", position="alibi")``."""
    return dataclasses.replace(get_preset(name), **overrides)


def _suggest(key: str, options) -> str:
    close = difflib.get_close_matches(key, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _build_section(section: str, values: dict) -> Any:
    cls = SECTIONS[section]
    values = dict(values)
    base = cls()
    if section == "model" and "preset" in values:
        base = get_preset(values.pop("preset"))
    names = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in names:
            raise ConfigError(
                f"unknown key {section}.{key}{_suggest(key, names)}; "
                f"valid keys: {', '.join(sorted(names))}"
            )
    # An override ``key=none`` reads as None; for a field that takes only strings (e.g.
    # model.position) it means the string "none".
    for f in dataclasses.fields(cls):
        if values.get(f.name, "") is None and f.type == "str":
            values[f.name] = "none"
    return dataclasses.replace(base, **values)


def from_dict(raw: dict, name: str = "experiment") -> Experiment:
    """Build an :class:`Experiment` from nested dicts (TOML or checkpoint JSON)."""
    raw = dict(raw)
    name = raw.pop("name", name)
    for key in raw:
        if key not in SECTIONS:
            raise ConfigError(
                f"unknown section [{key}]{_suggest(key, SECTIONS)}; "
                f"valid sections: {', '.join(SECTIONS)}"
            )
        if not isinstance(raw[key], dict):
            raise ConfigError(f"[{key}] must be a table of key = value lines, got {raw[key]!r}")
    sections = {key: _build_section(key, raw.get(key, {})) for key in SECTIONS}
    return Experiment(name=name, **sections)


def parse_value(text: str) -> Any:
    """A TOML value (``3``, ``1e-3``, ``true``, ``"s"``), ``none`` for None, else the string."""
    if text.strip().lower() in ("none", "null"):
        return None
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict, overrides) -> dict:
    """Apply ``section.key=value`` (or ``section.key.sub=value``) strings to nested dicts."""
    raw = json.loads(json.dumps(raw))  # deep copy of plain data
    for item in overrides:
        path, sep, text = item.partition("=")
        keys = path.strip().split(".")
        if not sep or len(keys) < 2 or not all(keys):
            raise ConfigError(
                f"override {item!r} must look like section.key=value, for example model.d_model=128"
            )
        node = raw
        for key in keys[:-1]:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {key} is a value, not a table")
        node[keys[-1]] = parse_value(text.strip())
    return raw


def load(path: str | Path, overrides=()) -> Experiment:
    """Read a TOML experiment (never executed) and apply ``section.key=value`` overrides.

    An override ``model.preset=NAME`` starts the model section afresh from that preset: the
    file's own ``[model]`` keys are dropped, and only model keys given on the command line
    too apply on top (so ``model.preset=gpt2-small`` gives GPT-2 small itself).
    """
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"config {str(path)!r} is a directory; pass a TOML file such as configs/reverse.toml"
        )
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist; see configs/ for examples")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    if any(item.partition("=")[0].strip() == "model.preset" for item in overrides):
        raw["model"] = {}
    return from_dict(apply_overrides(raw, overrides), name=path.stem)


def changes(a: Experiment | dict, b: Experiment | dict, sections=tuple(SECTIONS)) -> list:
    """``(key, value in a, value in b)`` for every field that differs, nested keys flattened
    (``data.task_params.max_len``); a key present on one side only has ``<missing>``."""
    a = a.to_dict() if isinstance(a, Experiment) else a
    b = b.to_dict() if isinstance(b, Experiment) else b
    out = []
    for section in sections:
        fa, fb = _flatten(a.get(section, {}), section), _flatten(b.get(section, {}), section)
        for key in sorted(set(fa) | set(fb)):
            va, vb = fa.get(key, _MISSING), fb.get(key, _MISSING)
            if va != vb:
                out.append((key, va, vb))
    return out


def diff(
    a: Experiment | dict,
    b: Experiment | dict,
    sections=("model",),
    labels: tuple[str, str] | None = None,
) -> list[str]:
    """Readable ``section.key: a != b`` lines for the fields that differ (see :func:`changes`).

    ``labels=("checkpoint", "now")`` names the sides: ``model.d_model: 64 (checkpoint) != 128
    (now)``.
    """
    left, right = (f" ({labels[0]})", f" ({labels[1]})") if labels else ("", "")
    return [f"{key}: {va!r}{left} != {vb!r}{right}" for key, va, vb in changes(a, b, sections)]


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


def _flatten(tree, prefix: str) -> dict:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(_flatten(value, f"{prefix}.{key}"))
    return out
