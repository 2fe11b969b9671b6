"""Orbax checkpoints that never lose the latest good state.

Layout (``Checkpointer(workdir)``)::

    workdir/checkpoints/<step>/state/      the train-state pytree (OCDBT + zarr, orbax StandardSave)
                              config/      the whole experiment config (JSON)
                              metadata/    {"step", "params_hash", "state_hash", "config_hash",
                                            "arrays", "metrics", "time", "tfmjax_version", ...}
                              metrics/     the metrics (orbax writes it when ``best_metric`` is set)
    workdir/checkpoints/<step>.orbax-checkpoint-tmp/   a save in progress (never listed as a step)
    workdir/checkpoints/<step>.corrupt/                a step that failed verification, moved aside

Guarantees:

* **Atomic saves.** Orbax writes each step into ``<step>.orbax-checkpoint-tmp`` and renames it
  to ``<step>`` only after every item is committed (``AtomicRenameTemporaryPath`` on local and
  POSIX file systems; on GCS orbax uses a ``commit_success.txt`` file instead). Steps are
  listed only from finalized names, so a save cut short (crash, ``kill -9``) is never "the
  latest". Old steps are deleted only after the new one is finalized.
* **Verified restores.** Orbax restores flipped bytes silently, so every restore re-hashes the
  arrays (:func:`params_hash`) and compares with the hash saved next to them. A corrupt,
  partial or unreadable step is reported in one log line and the previous step is used.
* **Readable errors.** A different model config or a state of another shape raises
  :class:`CheckpointError` naming the fields, never a pytree traceback.

Signals: :meth:`Checkpointer.save` and :meth:`Checkpointer.wait` hold SIGTERM and SIGINT back
while they run (in the main thread) and deliver them right after, so a handler that itself
calls ``save(...); wait()`` never interrupts orbax half-way through a save and never
deadlocks on orbax's internal locks. The simplest pattern is still for the handler to set a
flag that the loop checks once per step; both are safe.

Only single-host (fully addressable) arrays are hashed; multi-host runs are not supported here.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import math
import re
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

import tfmjax

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "load_config",
    "load_for_inference",
    "params_hash",
]

log = logging.getLogger(__name__)

CHECKPOINTS_SUBDIR = "checkpoints"
CORRUPT_SUFFIX = ".corrupt"
TMP_SUFFIX = ocp.path.atomicity.TMP_DIR_SUFFIX      # ".orbax-checkpoint-tmp"
FORMAT_VERSION = 1
_ITEMS = ("state", "config", "metadata")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read; the message says which and why, in one line."""


class _Corrupt(Exception):
    """Internal: this step failed verification; ``str(self)`` is the short reason."""


# --------------------------------------------------------------------------- hashing

def _key_name(key: Any) -> str:
    """One path entry as text: DictKey, GetAttrKey, SequenceKey or FlattenedIndexKey."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _path_str(path: tuple) -> str:
    """``params/dense/kernel``: the same for a dict and a dataclass with the same field names."""
    return "/".join(_key_name(k) for k in path)


def _flatten(tree: Any) -> list[tuple[str, Any]]:
    """``(path, leaf)`` pairs sorted by path."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return sorted(((_path_str(path), leaf) for path, leaf in leaves), key=lambda item: item[0])


def params_hash(tree: Any) -> str:
    """sha256 (hex) over every leaf's path, dtype, shape and bytes, in path-sorted order.

    Bit-exact: equal hashes mean equal trees (the same leaves at the same paths with the same
    dtypes, shapes and bits). A dict and a dataclass with the same field names hash the same.
    Typed PRNG keys are hashed as their key data under their key dtype name.
    """
    return _hashes(tree, None)[0]


def _hashes(tree: Any, sub: str | None) -> tuple[str, str | None]:
    """``(params_hash(tree), params_hash(tree[sub]))`` with one device-to-host copy."""
    entries = []
    for path, leaf in _flatten(tree):
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            entries.append((path, str(dtype), jax.random.key_data(leaf)))
        else:
            entries.append((path, None, leaf))
    hosts = jax.device_get([leaf for _, _, leaf in entries])          # one batched copy
    full, part = hashlib.sha256(), hashlib.sha256()
    for (path, dtype, _), host in zip(entries, hosts):
        array = np.ascontiguousarray(np.asarray(host))
        header = f"\0{dtype or array.dtype}\0{array.shape}\0{array.nbytes}\0".encode()
        data = array.reshape(-1).view(np.uint8).data
        full.update(path.encode() + header)
        full.update(data)
        # Paths under ``sub`` sort the same with or without the ``sub/`` prefix.
        if sub is not None and (path == sub or path.startswith(sub + "/")):
            part.update(path[len(sub) + 1:].encode() + header)
            part.update(data)
    return full.hexdigest(), (part.hexdigest() if sub is not None else None)


def _params_path(state: Any) -> str | None:
    """``"params"`` when the state's leaves include a ``params`` entry (dict key or field)."""
    paths = (path for path, _ in _flatten(state))
    return "params" if any(p == "params" or p.startswith("params/") for p in paths) else None


def _array_table(tree: Any) -> dict[str, list]:
    """``{path: [shape, dtype]}`` for every leaf: what a restore target must match."""
    table = {}
    for path, leaf in _flatten(tree):
        shape = list(getattr(leaf, "shape", np.shape(leaf)))
        dtype = getattr(leaf, "dtype", None)
        table[path] = [shape, str(dtype if dtype is not None else np.asarray(leaf).dtype)]
    return table


# --------------------------------------------------------------------------- small helpers

def _jsonable(value: Any) -> Any:
    """Plain JSON data: configs with to_dict(), tuples, numpy/jax scalars, paths."""
    if hasattr(value, "to_dict") and callable(value.to_dict):
        value = value.to_dict()

    def default(obj):
        if hasattr(obj, "tolist"):
            return obj.tolist()
        return str(obj)

    return json.loads(json.dumps(value, default=default))


def _json_hash(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _short(exc: BaseException, limit: int = 160) -> str:
    """The innermost cause of ``exc`` as one short line (tensorstore specs and paths cut)."""
    chain, err = [], exc
    while err is not None and len(chain) < 10:
        chain.append(err)
        err = err.__cause__ or err.__context__
    inner = chain[-1]
    lines = str(inner).strip().splitlines()
    text = lines[0].strip(" '\"") if lines else ""
    if match := re.search(r'Item "([^"]+)" was not found', text):
        return f'item "{match[1]}" is missing'
    text = re.sub(r"\s*\[tensorstore_spec.*$", "", text)
    text = re.sub(r' in OCDBT database at [^"]*"[^"]*"', "", text)
    text = re.sub(r'(Error opening "\w+" driver: )+', "", text)
    if not re.match(r"[A-Z_]{4,}: ", text):     # tensorstore status codes speak for themselves
        text = f"{type(inner).__name__}: {text}" if text else type(inner).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt(value: Any) -> str:
    return repr(value) if isinstance(value, str) else ("<missing>" if value is _MISSING else
                                                       json.dumps(value))


_MISSING = object()


def _flat_dict(d: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(d, Mapping):
        return {prefix: d}
    out = {}
    for key, value in d.items():
        out.update(_flat_dict(value, f"{prefix}.{key}"))
    return out


def _model_diff(saved: Mapping, now: Mapping) -> list[str]:
    """``model.d_model: 64 (checkpoint) != 128 (now)`` lines for the model fields that differ."""
    a = _flat_dict(saved.get("model", {}), "model")
    b = _flat_dict(now.get("model", {}), "model")
    lines = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, _MISSING), b.get(key, _MISSING)
        if va != vb:
            lines.append(f"{key}: {_fmt(va)} (checkpoint) != {_fmt(vb)} (now)")
    return lines


def _summarise(items: list[str], limit: int = 4) -> str:
    head = ", ".join(items[:limit])
    return head + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _structure_diff(saved: Mapping[str, list], target: Mapping[str, list]) -> list[str]:
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
                mismatched.append(f"{path}: shape {tuple(s_shape)} (checkpoint) != "
                                  f"{tuple(t_shape)} (now)")
            elif s_dtype != t_dtype:
                mismatched.append(f"{path}: dtype {s_dtype} (checkpoint) != {t_dtype} (now)")
    if mismatched:
        problems.append(_summarise(mismatched, limit=3))
    return problems


def _default_sharding() -> jax.sharding.Sharding:
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def _abstract(tree: Any) -> Any:
    """ShapeDtypeStructs with a sharding for every array leaf (default: the first local device)."""
    default = _default_sharding()

    def one(leaf):
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            return leaf
        sharding = getattr(leaf, "sharding", None)
        if not isinstance(sharding, jax.sharding.Sharding):
            sharding = default
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    return jax.tree.map(one, tree)


@contextlib.contextmanager
def _signals_deferred():
    """Hold SIGTERM/SIGINT back inside the block and re-deliver them when it ends.

    A Python signal handler runs in the main thread between two bytecodes, possibly in the
    middle of orbax code that holds a lock; a handler that saves would then deadlock or
    interleave two saves. Deferring makes save()/wait() atomic with respect to handlers.
    A no-op outside the main thread (handlers never run there).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(sig)
        if handler is None:                    # installed outside Python: leave it alone
            continue
        previous[sig] = handler
        signal.signal(sig, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(pending):     # each pending signal once, in arrival order
            signal.raise_signal(sig)


@contextlib.contextmanager
def _quiet_absl():
    """Silence orbax's absl warnings (read-only manager chatter) inside the block."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _finalized_steps(checkpoints_dir: Path) -> list[int]:
    """Finalized step numbers on disk (tmp dirs of saves in progress never match), ascending."""
    if not checkpoints_dir.is_dir():
        return []
    name_format = ocp.path.step.standard_name_format()
    return sorted(m.step for m in name_format.find_all(checkpoints_dir))


def _resolve(directory: str | Path) -> tuple[Path, int | None]:
    """``(checkpoints dir, step or None)`` for a workdir, a checkpoints dir or one step dir."""
    path = Path(directory).absolute()
    if not path.exists():
        raise CheckpointError(f"checkpoint directory {str(path)!r} does not exist")
    if TMP_SUFFIX in path.name:
        raise CheckpointError(f"{str(path)!r} is an unfinished save (orbax tmp dir), "
                              "not a checkpoint")
    if (path / CHECKPOINTS_SUBDIR).is_dir():
        return path / CHECKPOINTS_SUBDIR, None
    if path.name.isdigit() and any((path / item).exists() for item in _ITEMS):
        return path.parent, int(path.name)
    return path, None


# --------------------------------------------------------------------------- reading steps

class _Store:
    """An orbax CheckpointManager over ``checkpoints_dir`` plus verified per-step reads."""

    def __init__(self, checkpoints_dir: Path, *, writable: bool, state_handler,
                 options: ocp.CheckpointManagerOptions):
        self.dir = checkpoints_dir
        self.writable = writable
        handlers = {"state": state_handler, "config": ocp.JsonCheckpointHandler(),
                    "metadata": ocp.JsonCheckpointHandler()}
        with _quiet_absl():
            self.mgr = ocp.CheckpointManager(checkpoints_dir, options=options,
                                             item_handlers=handlers)

    def steps(self) -> list[int]:
        return _finalized_steps(self.dir)

    def read_json(self, step: int) -> tuple[dict, dict]:
        """``(metadata, config)`` of ``step``, checked; raises _Corrupt."""
        try:
            out = self.mgr.restore(step, args=ocp.args.Composite(
                metadata=ocp.args.JsonRestore(), config=ocp.args.JsonRestore()))
            metadata, config = out["metadata"], out["config"]
        except Exception as err:  # noqa: BLE001  (any failure to read means: not usable)
            raise _Corrupt(f"metadata/config unreadable: {_short(err)}") from None
        if not isinstance(metadata, dict) or "state_hash" not in metadata:
            raise _Corrupt("metadata missing or not written by tfmjax")
        if not isinstance(config, dict):
            raise _Corrupt("config missing")
        if metadata.get("config_hash") not in (None, _json_hash(config)):
            raise _Corrupt("config hash mismatch")
        return metadata, config

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

    def candidates(self, step: int | None) -> list[int]:
        """Steps to try, newest first: ``[step]`` when a step is asked for."""
        steps = self.steps()
        if step is None:
            return steps[::-1]
        if step not in steps:
            available = ", ".join(map(str, steps)) or "none"
            raise CheckpointError(f"no checkpoint for step {step} in {self.dir} "
                                  f"(available steps: {available})")
        return [step]

    def first_good(self, step: int | None, read_one):
        """``read_one(step)`` on the newest step that passes; one log line per corrupt step.

        ``read_one`` raises :class:`_Corrupt` for a bad step (try the next one) and
        :class:`CheckpointError` for a mistake of the caller (stop).
        """
        candidates = self.candidates(step)
        if not candidates:
            raise CheckpointError(f"no checkpoint in {self.dir}")
        failures, corrupt = [], []
        for i, s in enumerate(candidates):
            try:
                result = read_one(s)
            except _Corrupt as err:
                failures.append(f"step {s}: {err}")
                corrupt.append(s)
                if step is not None:
                    raise CheckpointError(f"checkpoint step {s} in {self.dir} is corrupt ({err})") \
                        from None
                nxt = candidates[i + 1] if i + 1 < len(candidates) else None
                then = f"falling back to step {nxt}" if nxt is not None else "no older checkpoint"
                log.warning("checkpoint step %d is corrupt (%s); %s", s, err, then)
                continue
            if self.writable:
                # Only once a good step is found: a passing outage never moves everything aside.
                for bad in corrupt:
                    with contextlib.suppress(OSError):
                        log.info("moved corrupt checkpoint step %d aside to %s", bad,
                                 self.quarantine(bad))
            return result, s
        raise CheckpointError(f"no good checkpoint in {self.dir}: {'; '.join(failures)}")


def _reader(checkpoints_dir: Path) -> _Store:
    options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0,
                                           enable_async_checkpointing=False)
    return _Store(checkpoints_dir, writable=False, state_handler=ocp.PyTreeCheckpointHandler(),
                  options=options)


# --------------------------------------------------------------------------- Checkpointer

class Checkpointer:
    """Save and restore the train state under ``directory/checkpoints``.

    Keeps the latest ``keep`` steps and, when ``best_metric`` is given, the best step by that
    metric (``best_mode`` "max" or "min") even when it is older. Saves are asynchronous
    (``save`` returns once the arrays are copied to the host) and atomic; call :meth:`wait`
    (or :meth:`close`) before the process exits.
    """

    def __init__(self, directory: str | Path, *, keep: int = 3, best_metric: str | None = None,
                 best_mode: str = "max"):
        if not isinstance(keep, int) or keep < 1:
            raise CheckpointError(f"keep={keep!r} is invalid: must be an int >= 1")
        if best_mode not in ("max", "min"):
            raise CheckpointError(f"best_mode={best_mode!r} is invalid: must be 'max' or 'min'")
        self.directory = Path(directory).absolute()  # Orbax wants absolute paths
        self.checkpoints_dir = self.directory / CHECKPOINTS_SUBDIR
        self.keep, self.best_metric, self.best_mode = keep, best_metric, best_mode
        policies: list = [ocm.LatestN(n=keep)]
        best_fn = None
        if best_metric is not None:
            worst = -math.inf if best_mode == "max" else math.inf

            def best_fn(metrics, _name=best_metric, _worst=worst):
                value = metrics.get(_name) if isinstance(metrics, Mapping) else None
                try:
                    value = float(value)
                except (TypeError, ValueError):
                    return _worst
                return _worst if math.isnan(value) else value

            # BestN keeps the n largest metric values; reverse=True keeps the n smallest.
            policies.append(ocm.BestN(get_metric_fn=best_fn, reverse=best_mode == "min", n=1,
                                      keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(
            # best_fn (with no max_to_keep) only makes orbax write and re-read the metrics;
            # what is kept is decided by preservation_policy alone.
            best_fn=best_fn,
            best_mode=best_mode,
            preservation_policy=ocm.AnyPreservationPolicy(policies),
            cleanup_tmp_directories=True,      # remove tmp dirs left by a killed save
            enable_async_checkpointing=True,
            create=True,
        )
        self._store = _Store(self.checkpoints_dir, writable=True,
                             state_handler=ocp.StandardCheckpointHandler(), options=options)
        self._mgr = self._store.mgr
        self._closed = False

    # -- saving ----------------------------------------------------------------------------

    def save(self, step: int, state: Any, *, config: Any, metrics: Mapping | None = None) -> bool:
        """Start saving ``state`` as ``step``; returns False if ``step`` is already saved.

        ``config`` is the whole experiment config (a dict, or an object with ``to_dict()``).
        Raises :class:`CheckpointError` if a newer step already exists (orbax would skip the
        save silently). Safe to call from a SIGTERM/SIGINT handler (see module docstring).
        """
        self._check_open()
        step = int(step)
        with _signals_deferred():
            latest = self._mgr.latest_step()      # includes a save still in flight
            if latest is not None and step == latest:
                log.info("checkpoint step %d is already saved; not saving it again", step)
                return False
            if latest is not None and step < latest:
                raise CheckpointError(
                    f"cannot save step {step}: {self.checkpoints_dir} already holds a newer "
                    f"checkpoint (step {latest}); resume from it or use a fresh workdir")
            config_json = _jsonable(config)
            if not isinstance(config_json, dict):
                raise CheckpointError(f"save(config=...) must be the experiment config as a dict, "
                                      f"got {type(config).__name__}")
            metrics_json = _jsonable(dict(metrics)) if metrics is not None else None
            params_path = _params_path(state)
            state_hash, sub_hash = _hashes(state, params_path)
            metadata = {
                "format": FORMAT_VERSION,
                "step": step,
                "params_hash": sub_hash if params_path is not None else state_hash,
                "params_path": params_path,
                "state_hash": state_hash,
                "config_hash": _json_hash(config_json),
                "arrays": _array_table(state),
                "metrics": metrics_json,
                "time": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "tfmjax_version": tfmjax.__version__,
            }
            try:
                return bool(self._mgr.save(step, args=ocp.args.Composite(
                    state=ocp.args.StandardSave(state),
                    config=ocp.args.JsonSave(config_json),
                    metadata=ocp.args.JsonSave(metadata),
                ), metrics=metrics_json))
            except Exception as err:  # noqa: BLE001
                raise CheckpointError(f"saving checkpoint step {step} failed: {_short(err)}") \
                    from err

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed. Safe from a signal handler."""
        with _signals_deferred():
            try:
                self._mgr.wait_until_finished()
            except Exception as err:  # noqa: BLE001
                raise CheckpointError(f"saving a checkpoint failed: {_short(err)}") from err

    def close(self) -> None:
        """Wait for the save in flight, then release orbax's threads. Idempotent."""
        if self._closed:
            return
        with _signals_deferred():
            self.wait()
            self._mgr.close()
            self._closed = True

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError(f"Checkpointer for {self.directory} is closed")

    # -- reading ---------------------------------------------------------------------------

    def latest_step(self) -> int | None:
        """The newest finalized step on disk (not yet verified; a save in flight is not counted)."""
        steps = self._store.steps()
        return steps[-1] if steps else None

    def best_step(self) -> int | None:
        """The best step by ``best_metric`` among those kept (the latest without a best_metric)."""
        return self._mgr.best_step()

    def all_steps(self) -> list[int]:
        """Finalized steps on disk, ascending."""
        return self._store.steps()

    def restore(self, abstract_state: Any, *, config: Any = None,
                step: int | None = None) -> tuple[Any, int]:
        """``(state, step)`` of the newest good checkpoint (or of ``step``).

        ``abstract_state``: a pytree of ``jax.ShapeDtypeStruct`` (e.g. ``jax.eval_shape`` of
        the init) or of arrays; leaves are restored onto its shapes, dtypes and shardings
        (leaves without a sharding go to the first local device). If ``config`` is given, its
        ``model`` section must equal the saved one. A corrupt newest step is logged in one
        warning line and the previous step is used; once a good step is found, the corrupt
        newer ones are renamed ``<step>.corrupt`` (kept for inspection) so that the run can
        save those step numbers again. With ``step`` given there is no fall-back.
        """
        self._check_open()
        self.wait()                      # a save of our own may still be in flight
        self._mgr.reload()
        target = _abstract(abstract_state)
        target_table = _array_table(target)
        config_now = _jsonable(config) if config is not None else None

        def read_one(s: int):
            metadata, saved_config = self._store.read_json(s)
            if config_now is not None:
                lines = _model_diff(saved_config, config_now)
                if len(lines) == 1:
                    raise CheckpointError(
                        f"checkpoint was written by a different model config: {lines[0]}")
                if lines:
                    raise CheckpointError("checkpoint was written by a different model config:\n  "
                                          + "\n  ".join(lines))
            problems = _structure_diff(metadata.get("arrays", {}), target_table)
            if problems:
                raise CheckpointError(f"checkpoint step {s} does not fit the state to restore "
                                      f"into: {'; '.join(problems)}")
            try:
                out = self._mgr.restore(s, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(target)))
                state = out["state"]
            except Exception as err:  # noqa: BLE001
                raise _Corrupt(f"state unreadable: {_short(err)}") from None
            if params_hash(state) != metadata["state_hash"]:
                raise _Corrupt("array hash mismatch")
            return state

        return self._store.first_good(step, read_one)

    def restore_or_none(self, abstract_state: Any, *, config: Any = None,
                        step: int | None = None) -> tuple[Any, int] | None:
        """Like :meth:`restore`, but ``None`` when there is no checkpoint at all."""
        if step is None and not self._store.steps():
            return None
        return self.restore(abstract_state, config=config, step=step)


# --------------------------------------------------------------------------- inference

def load_config(directory: str | Path) -> dict:
    """The experiment config (dict) of the newest checkpoint whose metadata and config verify.

    ``directory``: a workdir, its ``checkpoints`` dir, or one step dir. Arrays are not read
    (use :func:`load_for_inference` to get the params and their config together).
    """
    checkpoints_dir, step = _resolve(directory)
    store = _reader(checkpoints_dir)
    try:
        config, _ = store.first_good(step, lambda s: store.read_json(s)[1])
    finally:
        store.mgr.close()
    return config


def load_for_inference(directory: str | Path, *, return_step: bool = False):
    """``(config dict, params)`` of the newest checkpoint whose params verify.

    With ``return_step=True``: ``(config, params, step)``, the step actually loaded (an
    older one than the newest on disk if the newest is corrupt).

    Only the params subtree is read (no optimizer state), onto the first local device, as
    the shapes and dtypes recorded in the checkpoint; no abstract target is needed.
    ``directory``: a workdir, its ``checkpoints`` dir, or one step dir (no fall-back then).
    Turn the dict into an experiment with ``tfmjax.config.from_dict``.
    """
    checkpoints_dir, step = _resolve(directory)
    store = _reader(checkpoints_dir)
    sharding = _default_sharding()

    def read_one(s: int):
        metadata, config = store.read_json(s)
        name = metadata.get("params_path")
        try:
            tree = store.mgr.item_metadata(s)["state"]
            tree = getattr(tree, "tree", tree)
            sub = tree[name] if name is not None else tree
            target = jax.tree.map(
                lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding), sub)
            item = {name: target} if name is not None else target
            out = store.mgr.restore(s, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
                item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
                partial_restore=name is not None)))
            params = out["state"][name] if name is not None else out["state"]
        except Exception as err:  # noqa: BLE001
            raise _Corrupt(f"params unreadable: {_short(err)}") from None
        if params_hash(params) != metadata["params_hash"]:
            raise _Corrupt("array hash mismatch")
        return config, params

    try:
        (config, params), loaded = store.first_good(step, read_one)
    finally:
        store.mgr.close()
    return (config, params, loaded) if return_step else (config, params)
