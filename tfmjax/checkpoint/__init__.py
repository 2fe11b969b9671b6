"""Orbax checkpoints that never lose the latest good state.

Files: ``hashing`` (integrity), ``errors``, ``signals`` (held back around Orbax calls),
``orbax_log`` (Orbax's log records to a file), ``store`` (the directory and verified reads),
``manager`` (:class:`Checkpointer`, the train-state manager), ``inference`` (config and
params for evaluation and generation).

Layout (``Checkpointer(workdir)``)::

    workdir/checkpoints/<step>/state/      the train-state pytree (OCDBT + zarr, orbax StandardSave)
                              config/      the whole experiment config (JSON)
                              metadata/    {"step", "params_hash", "state_hash", "config_hash",
                                            "arrays", "metrics", "assets", "time", ...}
                                           (assets: e.g. a text task's tokenizer)
                              metrics/     the metrics (orbax writes it when ``best_metric`` is set)
    workdir/checkpoints/<step>.orbax-checkpoint-tmp/   a save in progress (never listed as a step)
    workdir/checkpoints/<step>.corrupt/                a step that failed verification, moved aside
    workdir/checkpoints.log     Orbax's own log records and tracebacks while a Checkpointer is
                                open (created on the first one; none in a normal run)

Guarantees:

* **Atomic saves.** Orbax writes each step into ``<step>.orbax-checkpoint-tmp`` and renames it
  to ``<step>`` only after every item is committed (``AtomicRenameTemporaryPath`` on local and
  POSIX file systems; on GCS orbax uses a ``commit_success.txt`` file instead). Steps are
  listed only from finalized names, so a save cut short (crash, ``kill -9``) is never "the
  latest". Old steps are deleted only after the new one is finalized.
* **Verified restores.** Orbax restores flipped bytes silently, so every restore re-hashes the
  arrays (:func:`params_hash`) and compares with the hash saved next to them. A corrupt,
  partial or unreadable step is reported in one log line and the previous step is used.
* **Failed saves cost nothing saved before.** A save that fails (disk full, permission
  denied, read-only disk, directory removed) raises one :class:`CheckpointError` line naming
  that step, the directory, the cause and what to do, e.g. ``saving checkpoint step 60 to
  /x/checkpoints failed: no space left on device: free space there or set train.workdir to a
  larger disk (orbax log: /x/checkpoints.log)``. Saves are asynchronous, so a failure in the
  background is raised by the next ``save``/``wait``/``close``, still naming its own step.
  The half-written ``<step>.orbax-checkpoint-tmp`` is removed; Orbax's tracebacks go to
  ``checkpoints.log``, not to the terminal.
* **Readable errors.** A different model config or a state of another shape raises
  :class:`CheckpointError` naming the fields, never a pytree traceback.

Signals: :meth:`Checkpointer.save` and :meth:`Checkpointer.wait` hold SIGTERM and SIGINT back
while they run (in the main thread) and deliver them right after, so a handler that itself
calls ``save(...); wait()`` never interrupts orbax half-way through a save and never
deadlocks on orbax's internal locks. The simplest pattern is still for the handler to set a
flag that the loop checks once per step; both are safe.

Arrays split over several processes are gathered to the host to be hashed (a collective:
every process saves and restores at the same point).
"""

from tfmjax.checkpoint.errors import CheckpointError
from tfmjax.checkpoint.hashing import params_hash
from tfmjax.checkpoint.inference import (
    NO_HF_TOKENIZER,
    carried_assets,
    hf_tokenizer_of,
    is_imported,
    load_assets,
    load_config,
    load_for_inference,
    load_on_mesh,
    open_checkpoint_source,
    workdir_of,
)
from tfmjax.checkpoint.manager import Checkpointer

__all__ = [
    "NO_HF_TOKENIZER",
    "CheckpointError",
    "Checkpointer",
    "carried_assets",
    "hf_tokenizer_of",
    "is_imported",
    "load_assets",
    "load_config",
    "load_for_inference",
    "load_on_mesh",
    "open_checkpoint_source",
    "params_hash",
    "workdir_of",
]
