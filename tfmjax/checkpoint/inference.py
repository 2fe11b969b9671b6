"""Loading for evaluation and generation: the config and params of a checkpoint, no train state."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from tfmjax.checkpoint.data_origin import check_same_data
from tfmjax.checkpoint.errors import CheckpointError, CorruptStep, short_error
from tfmjax.checkpoint.hashing import params_hash
from tfmjax.checkpoint.store import default_sharding, reader, resolve
from tfmjax.config import from_dict
from tfmjax.models import build
from tfmjax.parallel.inference import inference_placement
from tfmjax.parallel.placement import Placement, with_shardings


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


def is_imported(experiment, assets: dict) -> bool:
    """Whether a checkpoint is an imported Hugging Face model itself (not fine-tuned): its
    assets say so, or, imported before they did, its workdir holds ``hf_config.json``."""
    if experiment.train.init_from:
        return False
    workdir = experiment.train.workdir
    return "hf" in assets or bool(workdir) and (Path(workdir) / "hf_config.json").is_file()


def carried_assets(directory: str | Path | None) -> dict:
    """The assets a run started from (``train.init_from``) or resumed in ``directory`` saves
    again with each of its steps: an imported model's ``"hf"`` record (its original
    ``config.json`` and dtype) and its Hugging Face tokenizer. ``{}`` for None or a checkpoint
    without them."""
    if not directory:
        return {}
    checkpoints_dir, step = resolve(directory)
    store = reader(checkpoints_dir)
    try:
        metadata, _ = store.first_good(step, lambda s: store.read_json(s)[0])
    finally:
        store.mgr.close()
    assets = metadata.get("assets") or {}
    tokenizer = assets.get("tokenizer") or {}
    carried = {"hf": assets["hf"]} if "hf" in assets else {}
    return carried | ({"tokenizer": tokenizer} if tokenizer.get("kind") == "hf" else {})


NO_HF_TOKENIZER = (
    "no tokenizer.json beside the weights: generate takes --ids only; put the model's "
    "tokenizer.json (tokenizer.save_pretrained) there and import again for --input text"
)


def hf_tokenizer_of(experiment, assets: dict):
    """The Hugging Face tokenizer an imported model reads text with (``None``: it has none,
    or it was fine-tuned on a task, ``train.init_from``, and reads that task's inputs)."""
    from tfmjax.data.tokenizers import tokenizer_from_dict

    saved = assets.get("tokenizer") or {}
    if saved.get("kind") != "hf" or experiment.train.init_from:
        return None
    return tokenizer_from_dict(saved)


def load_for_inference(directory: str | Path):
    """``(config dict, params, step)`` of the newest checkpoint whose params verify.

    ``step`` is the step actually loaded: an older one than the newest on disk when the
    newest is corrupt.

    Only the params subtree is read (no optimizer state), onto the first local device, as
    the shapes and dtypes recorded in the checkpoint; no abstract target is needed.
    ``directory``: a workdir, its ``checkpoints`` dir, or one step dir (no fall-back then).
    Turn the dict into an experiment with ``tfmjax.config.from_dict``. To load onto a
    mesh (a model too big for one device), see :func:`load_on_mesh`.
    """
    sharding = default_sharding()
    loaded = _load_params(directory, lambda config, tree: jax.tree.map(lambda _: sharding, tree))
    return loaded.config, loaded.params, loaded.step


@dataclasses.dataclass(frozen=True)
class OnMesh:
    """A checkpoint's params laid out on a mesh (:func:`load_on_mesh`)."""

    config: dict  # the experiment config saved with the params
    params: Any  # as saved (``{"params": ...}`` for a trained model), split as the rules say
    step: int  # the step actually loaded
    placement: Placement  # evaluate and decode under ``placement.context()``
    note: str | None  # one line naming the mesh when it is not the checkpoint's own


def load_on_mesh(directory: str | Path, mesh: Sequence[str] = (), devices=None) -> OnMesh:
    """The newest checkpoint whose params verify, restored directly onto a mesh: every
    device reads only its own shards of each param, as the rules of the mesh split it (no
    device ever holds a whole sharded param; several processes each read their part).

    ``mesh``: ``mesh.*=value`` overrides of the checkpoint's ``[mesh]`` (none: the
    checkpoint's mesh fitted to the devices present; see
    :func:`tfmjax.parallel.inference.inference_placement`). ``devices``: default all of
    ``jax.devices()``. The integrity hash is checked over the whole arrays (gathered to the
    host, a collective with several processes). Raises CheckpointError as
    :func:`load_for_inference`, ConfigError (one line) for a mesh that cannot work.
    """
    placements = {}

    def shardings(config: dict, tree):
        experiment = from_dict(config)
        placement, note = inference_placement(experiment, mesh, devices)
        placements["last"] = placement, note
        by_path = _by_path(placement.params(build(experiment.model)))
        replicated = placement.replicated

        def one(path, leaf):  # a bare params tree (an imported model) has no "params" key
            key = jax.tree_util.keystr(path)
            sharding = by_path.get(key, by_path.get("['params']" + key))
            try:
                sharding.shard_shape(tuple(leaf.shape))  # it splits this leaf evenly
            except Exception:  # noqa: BLE001  (none, or not this leaf's: whole on every device)
                return replicated
            return sharding

        return jax.tree_util.tree_map_with_path(one, tree)

    loaded = _load_params(directory, shardings)
    placement, note = placements["last"]
    return OnMesh(loaded.config, loaded.params, loaded.step, placement, note)


def _by_path(tree) -> dict:
    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree.leaves_with_path(tree)}


@dataclasses.dataclass(frozen=True)
class _Loaded:
    config: dict
    params: Any
    step: int


def _load_params(directory: str | Path, shardings) -> _Loaded:
    """The newest step whose params verify, each leaf restored with the sharding
    ``shardings(config dict, tree of the saved params' metadata)`` gives it."""
    checkpoints_dir, step = resolve(directory)
    store = reader(checkpoints_dir)

    def read_one(s: int):
        metadata, config = store.read_json(s)
        name = metadata.get("params_path")
        try:
            tree = store.mgr.item_metadata(s)["state"]
            tree = getattr(tree, "tree", tree)
            sub = tree[name] if name is not None else tree
        except Exception as err:  # noqa: BLE001
            raise CorruptStep(f"params unreadable: {short_error(err)}") from None
        placed = shardings(config, sub)  # a mesh that cannot work: the caller's ConfigError
        try:
            target = with_shardings(sub, placed)
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
    return _Loaded(config, params, loaded)


def open_checkpoint_source(path, step: int, data, *, accept_changed_data: bool = False):
    """The data source of a checkpoint's ``data`` config: your own task or text file found
    where checkpoint ``step`` recorded it, with the bytes it recorded (a changed file is a
    one-line CheckpointError unless ``accept_changed_data``: :mod:`.data_origin`), and a text
    task gets the tokenizer saved there (never a newly trained one)."""
    from tfmjax.data.sources import is_text, open_source
    from tfmjax.data.tasks import TASK_NAMES
    from tfmjax.data.tokenizers import tokenizer_from_dict
    from tfmjax.data.user_data import found_record

    if data.task in TASK_NAMES:  # a built-in toy task: nothing to read from the checkpoint
        return open_source(data.task, data.task_params)
    assets = load_assets(path, step)
    origin = assets.get("task_origin")
    try:  # the bytes first: a changed file is named before anything reads it
        current = found_record(data.task, origin)
    except ValueError:
        current = None  # not found or not importable: open_source says so below
    check_same_data(origin, current, step=step, accept=accept_changed_data)
    tokenizer = None
    if is_text(data.task):
        saved = assets.get("tokenizer")
        if saved is None:
            raise CheckpointError(
                f"checkpoint step {step} of text task {data.task!r} holds no tokenizer; it was "
                "written by an older tfmjax: retrain, or evaluate a newer checkpoint"
            )
        tokenizer = tokenizer_from_dict(saved)
    return open_source(data.task, data.task_params, tokenizer=tokenizer, origin=origin)


def workdir_of(path: str | Path) -> Path:
    """The workdir a checkpoint path (a workdir, its checkpoints dir or a step dir) belongs to."""
    path = Path(path)
    if path.name.isdigit() and path.parent.name == "checkpoints":
        return path.parent.parent
    if path.name == "checkpoints":
        return path.parent
    return path
