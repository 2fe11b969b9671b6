"""The run's other sections (``[optim]``, ``[data]``, ``[train]``, ``[mesh]``) and
:class:`Experiment`, which holds one of each with the model."""

from __future__ import annotations

import dataclasses
import json
import math

from tfmjax.config.checks import check_types, one_of, positive, require
from tfmjax.config.choices import EVAL_METRICS, MESH_AXES, RULE_SETS, SCHEDULES
from tfmjax.config.fields import option
from tfmjax.config.model import ModelConfig
from tfmjax.config.task_spec import parse_task_spec

# train.steps_per_call="auto" on a GPU or TPU: at most this many steps a call (shakespeare_char
# trained 1.4x (H200 host) to 3.3x (H100 host) faster with 16 a call than with 1).
AUTO_STEPS_PER_CALL = 16


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimiser and learning-rate schedule."""

    learning_rate: float = option(
        1e-3, help="peak learning rate (inverse_sqrt: a multiplier, 1.0 = the paper)"
    )
    schedule: str = option(
        "cosine", help="inverse_sqrt, cosine, linear, constant or wsd, all with linear warmup"
    )
    warmup_steps: int = option(100, help="steps of linear warmup from 0")
    end_learning_rate: float = option(0.0, help="where cosine, linear and wsd end")
    decay_fraction: float = option(0.1, help="wsd: share of the steps spent decaying")
    schedule_steps: int = option(
        0,
        help="steps cosine, linear and wsd span (0: train.steps); past them the rate stays at "
        "optim.end_learning_rate",
    )
    weight_decay: float = option(
        0.0, help="AdamW decoupled weight decay (not on norms, biases, embeddings)"
    )
    b1: float = option(0.9, help="Adam beta1")
    b2: float = option(0.98, help="Adam beta2")
    eps: float = option(1e-9, help="Adam epsilon")
    clip_norm: float | None = option(1.0, help="global gradient-norm clipping; none = off")
    grad_accum_steps: int = option(
        1, help="micro-batches per step (data.batch_size must divide by it)"
    )
    label_smoothing: float = option(0.0, help="label smoothing of the training loss")

    def __post_init__(self):
        check_types("optim", self)
        one_of("optim.schedule", self.schedule, SCHEDULES)
        positive("optim", self, "learning_rate", "eps", "clip_norm", "grad_accum_steps")
        require(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "must be >= 0")
        require(
            self.schedule_steps >= 0,
            "optim.schedule_steps",
            self.schedule_steps,
            "must be >= 0 (0: train.steps)",
        )
        require(self.weight_decay >= 0, "optim.weight_decay", self.weight_decay, "must be >= 0")
        require(
            0 <= self.end_learning_rate,
            "optim.end_learning_rate",
            self.end_learning_rate,
            "must be >= 0",
        )
        for name in ("b1", "b2", "label_smoothing", "decay_fraction"):
            value = getattr(self, name)
            require(0.0 <= value < 1.0, f"optim.{name}", value, "must be in [0, 1)")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Which task or text, its parameters, and the batch size."""

    task: str = option(
        "reverse",
        help="toy task or text corpus (python -m tfmjax.config.explain lists them), "
        "text:PATH (your text file), PATH.py:Class or package.module:Class (your task)",
    )
    task_params: dict = option(
        default_factory=dict, help="the task's parameters, e.g. {max_len = 8}"
    )
    batch_size: int = option(64, help="examples per training step")
    eval_examples: int = option(512, help="examples in each evaluation")

    def __post_init__(self):
        check_types("data", self)
        try:
            parse_task_spec(self.task)
        except ValueError as err:
            require(False, "data.task", self.task, str(err))
        positive("data", self, "batch_size", "eval_examples")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The training run: length, seed, where it writes and how often."""

    steps: int = option(1000, help="optimizer updates in the whole run")
    seed: int = option(0, help="initialisation, dropout and the training batches")
    workdir: str = option("", help="where checkpoints and logs go; empty = runs/<config name>")
    log_every: int = option(50, help="steps between metric records")
    eval_every: int = option(250, help="steps between evaluations")
    checkpoint_every: int = option(250, help="steps between checkpoints")
    keep_checkpoints: int = option(3, help="newest checkpoints kept (the best one is kept too)")
    best_metric: str = option("exact_match", help="eval metric that picks the best checkpoint")
    tensorboard: bool = option(False, help="also write TensorBoard event files")
    init_from: str = option(
        "", help="a new run starts from the params of this checkpoint (e.g. an HF import)"
    )
    steps_per_call: int | str = option(
        "auto",
        help="steps run in one jitted call (a lax.scan over K batches; the same params and "
        "records as 1); log_every, eval_every and checkpoint_every must be multiples of it; "
        f"'auto': 1 on a CPU, on a GPU or TPU the largest K <= {AUTO_STEPS_PER_CALL} dividing them",
    )
    prefetch: bool = option(
        True, help="build the next batches on a background thread while the steps run"
    )
    loss_chunk: int = option(
        0,
        help="positions per chunk of the training loss: the output projection and the "
        "cross-entropy run chunk by chunk, recomputed in the backward pass, so float32 logits "
        "[B, T, V] never exist at once (the same loss and gradients); 0 = the whole batch",
    )

    def steps_per_call_on(self, backend: str) -> int:
        """The steps a call runs on ``backend`` (``jax.default_backend()``): ``steps_per_call``,
        or for ``"auto"`` 1 on a CPU (where a call's overhead is small beside its steps) and on
        a GPU or TPU the largest K <= 16 dividing the log, eval and save intervals (a fast
        device then never waits on Python between steps; the bits are the same)."""
        if self.steps_per_call != "auto":
            return self.steps_per_call
        if backend == "cpu":
            return 1
        every = math.gcd(self.log_every, self.eval_every, self.checkpoint_every)
        return max(k for k in range(1, AUTO_STEPS_PER_CALL + 1) if every % k == 0)

    def __post_init__(self):
        check_types("train", self)
        positive(
            "train",
            self,
            "steps",
            "log_every",
            "eval_every",
            "checkpoint_every",
            "keep_checkpoints",
        )
        require(self.loss_chunk >= 0, "train.loss_chunk", self.loss_chunk, "must be >= 0")
        require(self.seed >= 0, "train.seed", self.seed, "must be >= 0")
        one_of("train.best_metric", self.best_metric, EVAL_METRICS)
        k = self.steps_per_call
        if isinstance(k, str):
            one_of("train.steps_per_call", k, ("auto",))
            return
        positive("train", self, "steps_per_call")
        off = [
            f"train.{name}={getattr(self, name)}"
            for name in ("log_every", "eval_every", "checkpoint_every")
            if getattr(self, name) % k
        ]
        require(
            not off,
            "train.steps_per_call",
            k,
            f"{', '.join(off)} must be multiples of it (records, evaluations and saves come "
            f"between calls of {k} steps); change them or pick a steps_per_call that divides them",
        )


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """How the run spreads over devices: a ``data x fsdp x expert x tensor`` mesh and a rule
    set.

    ``-1`` (at most one axis) means "the devices the other axes leave". The default is one
    device. The mesh is not part of the model: a checkpoint restores onto any mesh.
    Whether the sizes fit the machine and the model is checked when the mesh is built
    (:func:`tfmjax.parallel.check_mesh`), where the device count is known.
    """

    data: int = option(
        1, help="data-parallel devices (whole params, a slice of the batch); -1: the rest"
    )
    fsdp: int = option(
        1, help="FSDP devices (1/fsdp of the params, a slice of the batch); -1: the rest"
    )
    tensor: int = option(
        1, help="tensor-parallel devices (heads, FFN, vocabulary split); -1: the rest"
    )
    expert: int = option(
        1,
        help="expert-parallel devices (the experts of MoE layers split, a slice of the batch); "
        "-1: the rest",
    )
    rules: str = option(
        "standard", help="standard (params sharded as the mesh says) or replicated (params whole)"
    )

    def __post_init__(self):
        check_types("mesh", self)
        sizes = {axis: getattr(self, axis) for axis in MESH_AXES}
        for axis, size in sizes.items():
            require(size == -1 or size >= 1, f"mesh.{axis}", size, "must be >= 1, or -1")
        rest = [axis for axis, size in sizes.items() if size == -1]
        require(
            len(rest) <= 1,
            f"mesh.{rest[-1] if rest else ''}",
            -1,
            f"only one mesh axis may be -1 (the rest of the devices); {', '.join(rest)} are",
        )
        one_of("mesh.rules", self.rules, RULE_SETS)


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
        require(
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
