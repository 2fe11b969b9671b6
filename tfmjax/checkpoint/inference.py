"""Loading for evaluation and generation: the config and params of a checkpoint, no train state."""

from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp

from tfmjax.checkpoint.errors import CheckpointError, CorruptStep, short_error
from tfmjax.checkpoint.hashing import params_hash
from tfmjax.checkpoint.store import default_sharding, reader, resolve


def load_config(directory: str | Path) -> dict:
    """The experiment config (dict) of the newest checkpoint whose metadata and config verify.

    ``directory``: a workdir, its ``checkpoints`` dir, or one step dir. Arrays are not read
    (use :func:`load_for_inference` to get the params and their config together).
    """
    checkpoints_dir, step = resolve(directory)
    store = reader(checkpoints_dir)
    try:
        config, _ = store.first_good(step, lambda s: store.read_json(s)[1])
    finally:
        store.mgr.close()
    return config


def load_assets(directory: str | Path, step: int) -> dict:
    """The assets saved with checkpoint ``step`` (e.g. ``{"tokenizer": ...}`` of a text
    task; ``{}`` when it has none). ``directory`` as for :func:`load_config`."""
    checkpoints_dir, _ = resolve(directory)
    store = reader(checkpoints_dir)
    try:
        metadata, _ = store.read_json(step)
    except CorruptStep as err:
        raise CheckpointError(
            f"checkpoint step {step} in {checkpoints_dir}: {err}; its assets cannot be read"
        ) from None
    finally:
        store.mgr.close()
    return metadata.get("assets") or {}


def load_for_inference(directory: str | Path):
    """``(config dict, params, step)`` of the newest checkpoint whose params verify.

    ``step`` is the step actually loaded: an older one than the newest on disk when the
    newest is corrupt.

    Only the params subtree is read (no optimizer state), onto the first local device, as
    the shapes and dtypes recorded in the checkpoint; no abstract target is needed.
    ``directory``: a workdir, its ``checkpoints`` dir, or one step dir (no fall-back then).
    Turn the dict into an experiment with ``tfmjax.config.from_dict``.
    """
    checkpoints_dir, step = resolve(directory)
    store = reader(checkpoints_dir)
    sharding = default_sharding()

    def read_one(s: int):
        metadata, config = store.read_json(s)
        name = metadata.get("params_path")
        try:
            tree = store.mgr.item_metadata(s)["state"]
            tree = getattr(tree, "tree", tree)
            sub = tree[name] if name is not None else tree
            target = jax.tree.map(
                lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding), sub
            )
            item = {name: target} if name is not None else target
            out = store.mgr.restore(
                s,
                args=ocp.args.Composite(
                    state=ocp.args.PyTreeRestore(
                        item=item,
                        restore_args=ocp.checkpoint_utils.construct_restore_args(item),
                        partial_restore=name is not None,
                    )
                ),
            )
            params = out["state"][name] if name is not None else out["state"]
        except Exception as err:  # noqa: BLE001
            raise CorruptStep(f"params unreadable: {short_error(err)}") from None
        if params_hash(params) != metadata["params_hash"]:
            raise CorruptStep("array hash mismatch")
        return config, params

    try:
        (config, params), loaded = store.first_good(step, read_one)
    finally:
        store.mgr.close()
    return config, params, loaded


def open_checkpoint_source(path, step: int, data):
    """The data source of a checkpoint's ``data`` config; a text task gets the tokenizer
    saved in checkpoint ``step`` (never a newly trained one)."""
    from tfmjax.data.sources import is_text, open_source
    from tfmjax.data.tokenizers import tokenizer_from_dict

    if not is_text(data.task):
        return open_source(data.task, data.task_params)
    saved = load_assets(path, step).get("tokenizer")
    if saved is None:
        raise CheckpointError(
            f"checkpoint step {step} of text task {data.task!r} holds no tokenizer; it was "
            "written by an older tfmjax: retrain, or evaluate a newer checkpoint"
        )
    return open_source(data.task, data.task_params, tokenizer=tokenizer_from_dict(saved))


def workdir_of(path: str | Path) -> Path:
    """The workdir a checkpoint path (a workdir, its checkpoints dir or a step dir) belongs to."""
    path = Path(path)
    if path.name.isdigit() and path.parent.name == "checkpoints":
        return path.parent.parent
    if path.name == "checkpoints":
        return path.parent
    return path
