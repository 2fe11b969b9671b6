"""The checkpoint directory: finalized steps, an Orbax manager with verified reads, fallback.

Layout: ``<dir>/checkpoints/<step>/{state,config,metadata}``; a save in progress is
``<step>.orbax-checkpoint-tmp`` (never listed), a step that failed verification is moved to
``<step>.corrupt``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from tfmjax.checkpoint.errors import CheckpointError, CorruptStep, short_error
from tfmjax.checkpoint.hashing import json_hash
from tfmjax.checkpoint.signals import quiet_absl
from tfmjax.config.saved import upgrade_saved
from tfmjax.parallel.processes import barrier, is_main

log = logging.getLogger("tfmjax.checkpoint")

CHECKPOINTS_SUBDIR = "checkpoints"
CORRUPT_SUFFIX = ".corrupt"
TMP_SUFFIX = ocp.path.atomicity.TMP_DIR_SUFFIX  # ".orbax-checkpoint-tmp"
ITEMS = ("state", "config", "metadata")


def _summarise(items: list[str], limit: int = 4) -> str:
    head = ", ".join(items[:limit])
    return head + (f" and {len(items) - limit} more" if len(items) > limit else "")


def structure_diff(saved: Mapping[str, list], target: Mapping[str, list]) -> list[str]:
    """Why a checkpoint's arrays don't fit a restore target (empty list: they do)."""
    problems = []
    only_saved = [p for p in saved if p not in target]
    only_target = [p for p in target if p not in saved]
    if only_target:
        problems.append(f"missing from the checkpoint: {_summarise(only_target)}")
    if only_saved:
        problems.append(f"only in the checkpoint: {_summarise(only_saved)}")
    mismatched = []
    for path in saved:
        if path in target:
            (s_shape, s_dtype), (t_shape, t_dtype) = saved[path], target[path]
            if list(s_shape) != list(t_shape):
                mismatched.append(
                    f"{path}: shape {tuple(s_shape)} (checkpoint) != {tuple(t_shape)} (now)"
                )
            elif s_dtype != t_dtype:
                mismatched.append(f"{path}: dtype {s_dtype} (checkpoint) != {t_dtype} (now)")
    if mismatched:
        problems.append(_summarise(mismatched, limit=3))
    return problems


def default_sharding() -> jax.sharding.Sharding:
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def abstract_target(tree: Any) -> Any:
    """ShapeDtypeStructs with a sharding for every array leaf (default: the first local device)."""
    default = default_sharding()

    def one(leaf):
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            return leaf
        sharding = getattr(leaf, "sharding", None)
        if not isinstance(sharding, jax.sharding.Sharding):
            sharding = default
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    return jax.tree.map(one, tree)


def finalized_steps(checkpoints_dir: Path) -> list[int]:
    """Finalized step numbers on disk (tmp dirs of saves in progress never match), ascending."""
    if not checkpoints_dir.is_dir():
        return []
    name_format = ocp.path.step.standard_name_format()
    return sorted(m.step for m in name_format.find_all(checkpoints_dir))


def resolve(directory: str | Path) -> tuple[Path, int | None]:
    """``(checkpoints dir, step or None)`` for a workdir, a checkpoints dir or one step dir."""
    path = Path(directory).absolute()
    if not path.exists():
        steps = finalized_steps(path.parent) if path.name.isdigit() else []
        if steps:  # a step that is not there, beside the ones that are
            raise CheckpointError(
                f"{path.parent} holds no checkpoint step {path.name}; its steps: "
                f"{', '.join(map(str, steps))} (give one, or the workdir for the newest)"
            )
        raise CheckpointError(f"checkpoint directory {str(path)!r} does not exist")
    if TMP_SUFFIX in path.name:
        raise CheckpointError(
            f"{str(path)!r} is an unfinished save (orbax tmp dir), not a checkpoint"
        )
    if (path / CHECKPOINTS_SUBDIR).is_dir():
        return path / CHECKPOINTS_SUBDIR, None
    if path.name.isdigit() and any((path / item).exists() for item in ITEMS):
        return path.parent, int(path.name)
    return path, None


class Store:
    """An orbax CheckpointManager over ``checkpoints_dir`` plus verified per-step reads."""

    def __init__(
        self,
        checkpoints_dir: Path,
        *,
        writable: bool,
        state_handler,
        options: ocp.CheckpointManagerOptions,
    ):
        self.dir = checkpoints_dir
        self.writable = writable
        handlers = {
            "state": state_handler,
            "config": ocp.JsonCheckpointHandler(),
            "metadata": ocp.JsonCheckpointHandler(),
        }
        with quiet_absl():
            self.mgr = ocp.CheckpointManager(
                checkpoints_dir, options=options, item_handlers=handlers
            )

    def steps(self) -> list[int]:
        return finalized_steps(self.dir)

    def read_json(self, step: int) -> tuple[dict, dict]:
        """``(metadata, config)`` of ``step``, checked; raises CorruptStep."""
        try:
            out = self.mgr.restore(
                step,
                args=ocp.args.Composite(
                    metadata=ocp.args.JsonRestore(), config=ocp.args.JsonRestore()
                ),
            )
            metadata, config = out["metadata"], out["config"]
        except Exception as err:  # noqa: BLE001  (any failure to read means: not usable)
            raise CorruptStep(f"metadata/config unreadable: {short_error(err)}") from None
        if not isinstance(metadata, dict) or "state_hash" not in metadata:
            raise CorruptStep("metadata missing or not written by tfmjax")
        if not isinstance(config, dict):
            raise CorruptStep("config missing")
        if metadata.get("config_hash") not in (None, json_hash(config)):
            raise CorruptStep("config hash mismatch")
        return metadata, upgrade_saved(config)

    def quarantine(self, step: int) -> str:
        """Move a corrupt step aside (``<step>.corrupt``) so later saves are not blocked by it."""
        src = self.dir / str(step)
        dst = self.dir / f"{step}{CORRUPT_SUFFIX}"
        n = 1
        while dst.exists():
            n += 1
            dst = self.dir / f"{step}{CORRUPT_SUFFIX}{n}"
        src.rename(dst)
        self.mgr.reload()
        return dst.name

    def _quarantine_all(self, corrupt: list[int]) -> None:
        """Move the corrupt steps aside. With several processes (one shared workdir, each
        found the same steps) process 0 alone renames them while the others wait for it at a
        barrier, then all reload the listing."""
        main = is_main()
        if main:
            for bad in corrupt:
                with contextlib.suppress(OSError):
                    log.info(
                        "moved corrupt checkpoint step %d aside to %s", bad, self.quarantine(bad)
                    )
        barrier("tfmjax: corrupt checkpoints moved aside")
        if not main:
            self.mgr.reload()

    def candidates(self, step: int | None) -> list[int]:
        """Steps to try, newest first: ``[step]`` when a step is asked for."""
        steps = self.steps()
        if step is None:
            return steps[::-1]
        if step not in steps:
            available = ", ".join(map(str, steps)) or "none"
            raise CheckpointError(
                f"no checkpoint for step {step} in {self.dir} (available steps: {available})"
            )
        return [step]

    def first_good(self, step: int | None, read_one):
        """``read_one(step)`` on the newest step that passes; one log line per corrupt step.

        ``read_one`` raises :class:`CorruptStep` for a bad step (try the next one) and
        :class:`CheckpointError` for a mistake of the caller (stop).
        """
        candidates = self.candidates(step)
        if not candidates:
            raise CheckpointError(f"no checkpoint in {self.dir}")
        failures, corrupt = [], []
        for i, s in enumerate(candidates):
            try:
                result = read_one(s)
            except CorruptStep as err:
                failures.append(f"step {s}: {err}")
                corrupt.append(s)
                if step is not None:
                    raise CheckpointError(
                        f"checkpoint step {s} in {self.dir} is corrupt ({err})"
                    ) from None
                nxt = candidates[i + 1] if i + 1 < len(candidates) else None
                then = f"falling back to step {nxt}" if nxt is not None else "no older checkpoint"
                log.warning("checkpoint step %d is corrupt (%s); %s", s, err, then)
                continue
            if self.writable:
                # Only once a good step is found: a passing outage never moves everything aside.
                self._quarantine_all(corrupt)
            return result, s
        raise CheckpointError(f"no good checkpoint in {self.dir}: {'; '.join(failures)}")


def reader(checkpoints_dir: Path) -> Store:
    options = ocp.CheckpointManagerOptions(
        read_only=True, create=False, save_interval_steps=0, enable_async_checkpointing=False
    )
    return Store(
        checkpoints_dir,
        writable=False,
        state_handler=ocp.PyTreeCheckpointHandler(),
        options=options,
    )
