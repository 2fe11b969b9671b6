"""``Checkpointer``: save and restore the train state (keep latest N and the best; async,
atomic; signals held back; restore verified, falling back past corrupt steps)."""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

import tfmjax
import tfmjax.checkpoint.orbax_log as orbax_log
from tfmjax.checkpoint.errors import CheckpointError, CorruptStep, save_cause, short_error
from tfmjax.checkpoint.hashing import (
    array_table,
    json_hash,
    jsonable,
    params_hash,
    params_path,
    state_hashes,
)
from tfmjax.checkpoint.signals import signals_deferred
from tfmjax.checkpoint.store import (
    CHECKPOINTS_SUBDIR,
    TMP_SUFFIX,
    Store,
    abstract_target,
    structure_diff,
)
from tfmjax.config import diff

log = logging.getLogger("tfmjax.checkpoint")

FORMAT_VERSION = 1


class Checkpointer:
    """Save and restore the train state under ``directory/checkpoints``.

    Keeps the latest ``keep`` steps and, when ``best_metric`` is given, the best step by that
    metric (``best_mode`` "max" or "min") even when it is older. Saves are asynchronous
    (``save`` returns once the arrays are copied to the host) and atomic; call :meth:`wait`
    (or :meth:`close`) before the process exits.

    A save that fails (disk full, permission denied, directory removed) raises one
    :class:`CheckpointError` line naming that step, the directory and the cause, from
    ``save`` itself or, when it failed in the background, from the next ``save``/``wait``/
    ``close``. Its temporary directory is removed; the earlier steps are untouched. Orbax's
    own log records (tracebacks of its threads) go to ``directory/checkpoints.log`` while
    the checkpointer is open, not to the terminal.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        keep: int = 3,
        best_metric: str | None = None,
        best_mode: str = "max",
    ):
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
            policies.append(
                ocm.BestN(
                    get_metric_fn=best_fn,
                    reverse=best_mode == "min",
                    n=1,
                    keep_checkpoints_without_metrics=False,
                )
            )
        options = ocp.CheckpointManagerOptions(
            # best_fn (with no max_to_keep) only makes orbax write and re-read the metrics;
            # what is kept is decided by preservation_policy alone.
            best_fn=best_fn,
            best_mode=best_mode,
            preservation_policy=ocm.AnyPreservationPolicy(policies),
            cleanup_tmp_directories=True,  # remove tmp dirs left by a killed save
            enable_async_checkpointing=True,
            # Create the step directory in save() itself: when that fails (no permission,
            # read-only disk, a file in the way), save() raises at once. Created in the
            # background, the failure left orbax's other threads waiting 300 s for it,
            # and the process hung at exit.
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
            create=True,
        )
        self.log_path = self.directory / orbax_log.LOG_NAME
        self._log = orbax_log.LogFile(self.log_path)
        orbax_log.attach(self._log)
        self._store = Store(
            self.checkpoints_dir,
            writable=True,
            state_handler=ocp.StandardCheckpointHandler(),
            options=options,
        )
        self._mgr = self._store.mgr
        self._closed = False
        self._in_flight: int | None = None  # the step whose background save is unfinished

    # -- saving ----------------------------------------------------------------------------

    def save(
        self,
        step: int,
        state: Any,
        *,
        config: Any,
        metrics: Mapping | None = None,
        assets: Mapping | None = None,
    ) -> bool:
        """Start saving ``state`` as ``step``; returns False if ``step`` is already saved.

        ``config`` is the whole experiment config (a dict, or an object with ``to_dict()``).
        ``assets``: JSON data the params need to be used (a text task's tokenizer), kept in
        the step's metadata (:func:`tfmjax.checkpoint.load_assets`).
        Raises :class:`CheckpointError` if a newer step already exists (orbax would skip the
        save silently), if this save fails to start, or if the previous save failed in the
        background (the message names that step). Safe to call from a SIGTERM/SIGINT handler
        (see module docstring).
        """
        self._check_open()
        step = int(step)
        with signals_deferred():
            latest = self._mgr.latest_step()  # includes a save still in flight
            if latest is not None and step == latest:
                log.info("checkpoint step %d is already saved; not saving it again", step)
                return False
            if latest is not None and step < latest:
                raise CheckpointError(
                    f"cannot save step {step}: {self.checkpoints_dir} already holds a newer "
                    f"checkpoint (step {latest}); resume from it or use a fresh workdir"
                )
            config_json = jsonable(config)
            if not isinstance(config_json, dict):
                raise CheckpointError(
                    f"save(config=...) must be the experiment config as a dict, "
                    f"got {type(config).__name__}"
                )
            metrics_json = jsonable(dict(metrics)) if metrics is not None else None
            params_at = params_path(state)
            state_hash, sub_hash = state_hashes(state, params_at)
            metadata = {
                "format": FORMAT_VERSION,
                "step": step,
                "params_hash": sub_hash if params_at is not None else state_hash,
                "params_path": params_at,
                "state_hash": state_hash,
                "config_hash": json_hash(config_json),
                "arrays": array_table(state),
                "metrics": metrics_json,
                "assets": jsonable(dict(assets)) if assets else None,
                "time": datetime.datetime.now(datetime.UTC).isoformat(),
                "tfmjax_version": tfmjax.__version__,
            }
            self._finish_in_flight()  # orbax would wait too: a failure there names that step
            try:
                saved = bool(
                    self._mgr.save(
                        step,
                        args=ocp.args.Composite(
                            state=ocp.args.StandardSave(state),
                            config=ocp.args.JsonSave(config_json),
                            metadata=ocp.args.JsonSave(metadata),
                        ),
                        metrics=metrics_json,
                    )
                )
            except Exception as err:  # noqa: BLE001
                # The background part may have started: let it end before cleaning up.
                with contextlib.suppress(Exception):
                    self._mgr.wait_until_finished()
                raise self._save_failed(step, err) from err
            if saved:
                self._in_flight = step
            return saved

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed. Safe from a signal handler.

        Raises :class:`CheckpointError` naming the step if that save failed.
        """
        with signals_deferred():
            self._finish_in_flight()

    def _finish_in_flight(self) -> None:
        step, self._in_flight = self._in_flight, None
        try:
            self._mgr.wait_until_finished()
        except Exception as err:  # noqa: BLE001
            raise self._save_failed(step, err) from err

    def _save_failed(self, step: int | None, err: BaseException) -> CheckpointError:
        """Remove the failed step's tmp dir, forget the step, and say what happened in one line.

        The earlier steps are never touched. Orbax's tracebacks are in the log file.
        """
        if step is not None:
            self._settle_background()
            tmp = self.checkpoints_dir / f"{step}{TMP_SUFFIX}"
            for _ in range(5):  # a straggling write may still have been creating files
                shutil.rmtree(tmp, ignore_errors=True)
                if not tmp.exists():
                    break
                time.sleep(0.1)
        with contextlib.suppress(Exception):
            self._mgr.reload()  # orbax may still list the failed step
        cause = save_cause(err)
        which = f"checkpoint step {step}" if step is not None else "a checkpoint"
        line = f"saving {which} to {self.checkpoints_dir} failed: {cause}"
        self._log.write_line(f"tfmjax: {line} ({short_error(err, 400)})")
        if self._log.flush() and self._log.written:  # written now that the tmp dir is gone
            line += f" (orbax log: {self.log_path})"
        return CheckpointError(line)

    def _settle_background(self, timeout: float = 60.0) -> None:
        """Let a failed save's other background writes end before its tmp dir is removed.

        Orbax reports the first write that fails and leaves the others running. Their
        futures are private to orbax (``_async_manager._commit_futures``): if that changes,
        this waits for nothing and the removal retries instead.
        """
        manager = getattr(getattr(self._mgr, "_checkpointer", None), "_async_manager", None)
        deadline = time.monotonic() + timeout
        for future in getattr(manager, "_commit_futures", None) or ():
            with contextlib.suppress(Exception):
                future.result(timeout=max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Wait for the save in flight, then release orbax's threads. Idempotent.

        Raises :class:`CheckpointError` if that save failed (orbax is released anyway).
        """
        if self._closed:
            return
        with signals_deferred():
            try:
                self._finish_in_flight()
            except CheckpointError:
                with contextlib.suppress(Exception):
                    self._mgr.close()
                raise
            else:
                self._mgr.close()
            finally:
                self._closed = True
                orbax_log.detach(self._log)

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

    def restore(
        self, abstract_state: Any, *, config: Any = None, step: int | None = None
    ) -> tuple[Any, int]:
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
        self.wait()  # a save of our own may still be in flight
        self._mgr.reload()
        target = abstract_target(abstract_state)
        target_table = array_table(target)
        config_now = jsonable(config) if config is not None else None

        def read_one(s: int):
            metadata, saved_config = self._store.read_json(s)
            if config_now is not None:
                lines = diff(saved_config, config_now, labels=("checkpoint", "now"))
                if len(lines) == 1:
                    raise CheckpointError(
                        f"checkpoint was written by a different model config: {lines[0]}"
                    )
                if lines:
                    raise CheckpointError(
                        "checkpoint was written by a different model config:\n  "
                        + "\n  ".join(lines)
                    )
            problems = structure_diff(metadata.get("arrays", {}), target_table)
            if problems:
                raise CheckpointError(
                    f"checkpoint step {s} does not fit the state to restore "
                    f"into: {'; '.join(problems)}"
                )
            try:
                out = self._mgr.restore(
                    s, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
                )
                state = out["state"]
            except Exception as err:  # noqa: BLE001
                raise CorruptStep(f"state unreadable: {short_error(err)}") from None
            if params_hash(state) != metadata["state_hash"]:
                raise CorruptStep("array hash mismatch")
            return state

        return self._store.first_good(step, read_one)

    def misfit(self, abstract_state: Any, step: int) -> list[str]:
        """How checkpoint ``step``'s arrays differ from ``abstract_state`` (names, shapes,
        dtypes), read from its metadata alone; ``[]`` when the state would restore into it.
        Raises CorruptStep for an unreadable step."""
        metadata, _ = self._store.read_json(step)
        target = array_table(abstract_target(abstract_state))
        return structure_diff(metadata.get("arrays", {}), target)

    def restore_or_none(
        self, abstract_state: Any, *, config: Any = None, step: int | None = None
    ) -> tuple[Any, int] | None:
        """Like :meth:`restore`, but ``None`` when there is no checkpoint at all."""
        if step is None and not self._store.steps():
            return None
        return self.restore(abstract_state, config=config, step=step)
