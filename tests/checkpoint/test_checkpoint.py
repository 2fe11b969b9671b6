"""Checkpoints: bit-exact round trips, preservation, corruption fall-back, kill -9, errors."""

import faulthandler
import gc
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tfmjax import config as tconfig
from tfmjax.checkpoint import (
    Checkpointer,
    CheckpointError,
    hashing,
    load_config,
    load_for_inference,
    params_hash,
)

# When a read fails, orbax/tensorstore may later call back into an asyncio loop orbax has
# already closed ("RuntimeError: Event loop is closed", reported as unraisable). Harmless.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

LOGGER = "tfmjax.checkpoint"
HANG_S = 600  # a hang guard, not a speed limit


@pytest.fixture(autouse=True)
def _collect_orbax_leftovers():
    """Collect those abandoned coroutines while this module's filter is active."""
    yield
    gc.collect()


CONFIG = {
    "name": "toy",
    "model": {"d_model": 64, "num_layers": 2, "dims": (1, 2)},
    "train": {"steps": 10},
}


def make_state(seed: int) -> dict:
    """A small train state: float32 + bfloat16 params, one incompressible uint32 table
    (stored verbatim by zstd, so its bytes can be found on disk), Adam state, step, key data."""
    key = jax.random.key(seed)
    k1, k2 = jax.random.split(key)
    params = {
        "dense": {"w": jax.random.normal(k1, (8, 16)), "b": jnp.full((16,), seed, jnp.bfloat16)},
        "table": jax.random.bits(k2, (64, 64), jnp.uint32),
    }
    return {
        "params": params,
        "opt_state": optax.adam(1e-3).init(params),
        "step": jnp.int32(seed),
        "rng": jax.random.key_data(key),
    }


ABSTRACT = jax.eval_shape(lambda: make_state(0))


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def save_steps(workdir, steps, **kwargs) -> Checkpointer:
    ckpt = Checkpointer(workdir, **kwargs)
    for step in steps:
        ckpt.save(step, make_state(step), config=CONFIG)
    ckpt.wait()
    return ckpt


def step_dir(workdir, step) -> Path:
    return Path(workdir) / "checkpoints" / str(step)


def find_table_bytes(workdir, step) -> tuple[Path, int]:
    """The data file (inside the step's OCDBT store) holding params/table, and an offset
    into the table's raw bytes."""
    raw = np.asarray(make_state(step)["params"]["table"]).tobytes()
    needle = raw[4096:4160]
    for path in sorted((step_dir(workdir, step) / "state").rglob("*")):
        if path.is_file() and (i := path.read_bytes().find(needle)) >= 0:
            return path, i
    raise AssertionError("could not find the table's bytes on disk")


def corrupt_lines(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and "is corrupt" in r.getMessage()
    ]


# --------------------------------------------------------------------------- params_hash


def test_params_hash_is_bit_exact_and_order_free():
    a = make_state(1)
    assert params_hash(a) == params_hash(make_state(1))
    assert params_hash(a) == params_hash(dict(reversed(list(a.items()))))
    flipped = jax.tree.map(lambda x: x, a)
    w = np.asarray(a["params"]["dense"]["w"]).copy()
    w.view(np.uint32)[3, 5] ^= 1  # one bit
    flipped["params"]["dense"]["w"] = jnp.asarray(w)
    assert params_hash(flipped) != params_hash(a)
    assert params_hash({"x": jnp.zeros(4, jnp.float32)}) != params_hash(
        {"x": jnp.zeros(4, jnp.int32)}
    )
    assert params_hash({"x": jnp.zeros((2, 2))}) != params_hash({"x": jnp.zeros(4)})
    assert params_hash({"x": jnp.zeros(2)}) != params_hash({"y": jnp.zeros(2)})

    @flax.struct.dataclass
    class State:
        params: dict
        step: jax.Array

    assert params_hash(State(params=a["params"], step=a["step"])) == params_hash(
        {"params": a["params"], "step": a["step"]}
    )


# --------------------------------------------------------------------------- round trip


def test_round_trip_is_bit_exact(tmp_path):
    state = make_state(7)
    with Checkpointer(tmp_path) as ckpt:
        assert ckpt.restore_or_none(ABSTRACT) is None
        assert ckpt.latest_step() is None
        ckpt.save(7, state, config=CONFIG, metrics={"acc": np.float32(0.5)})
        ckpt.wait()
        assert ckpt.latest_step() == 7
    with Checkpointer(tmp_path) as ckpt:  # a fresh process's view
        restored, step = ckpt.restore(ABSTRACT, config=CONFIG)
    assert step == 7
    assert params_hash(restored) == params_hash(state)
    assert_trees_equal(restored, state)
    assert restored["rng"].dtype == jnp.uint32 and restored["step"].dtype == jnp.int32
    assert restored["params"]["dense"]["b"].dtype == jnp.bfloat16
    assert isinstance(restored["params"]["dense"]["w"], jax.Array)
    assert not list((tmp_path / "checkpoints").glob("*tmp*"))


def test_restore_onto_given_sharding(tmp_path):
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    state = {"params": {"w": jnp.arange(64.0).reshape(8, 8)}}
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state, config=CONFIG)
        target = {"params": {"w": jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=sharded)}}
        restored, _ = ckpt.restore(target)
    assert restored["params"]["w"].sharding == sharded
    np.testing.assert_array_equal(
        np.asarray(restored["params"]["w"]), np.asarray(state["params"]["w"])
    )


def test_dataclass_state_and_concrete_target(tmp_path):
    @flax.struct.dataclass
    class TrainState:
        step: jax.Array
        params: dict
        opt_state: object
        rng: jax.Array

    s = make_state(3)
    state = TrainState(step=s["step"], params=s["params"], opt_state=s["opt_state"], rng=s["rng"])
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(3, state, config=CONFIG)
        restored, step = ckpt.restore(state)  # arrays work as a target too
    assert isinstance(restored, TrainState) and step == 3
    assert params_hash(restored) == params_hash(state)
    _, params, _ = load_for_inference(tmp_path)
    assert params_hash(params) == params_hash(state.params)


# --------------------------------------------------------------------------- preservation


@pytest.mark.parametrize("mode", ["max", "min"])
def test_keeps_latest_n_and_the_best(tmp_path, mode):
    metric = {1: 0.1, 2: 0.9, 3: 0.2, 4: 0.3, 5: 0.4, 6: 0.5}
    if mode == "min":
        metric = {k: -v for k, v in metric.items()}
    ckpt = Checkpointer(tmp_path, keep=2, best_metric="acc", best_mode=mode)
    for step in range(1, 7):
        ckpt.save(step, make_state(step), config=CONFIG, metrics={"acc": metric[step], "loss": 1.0})
    ckpt.close()
    assert sorted(
        int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()
    ) == [2, 5, 6]
    # After a restart the metrics come back from disk: the best survives further saves.
    ckpt = Checkpointer(tmp_path, keep=2, best_metric="acc", best_mode=mode)
    assert ckpt.best_step() == 2
    ckpt.save(7, make_state(7), config=CONFIG, metrics={"acc": metric[1]})
    ckpt.save(8, make_state(8), config=CONFIG)  # no metrics: kept only as latest
    ckpt.close()
    assert ckpt.all_steps() == [2, 7, 8]


def test_saving_an_older_step_is_an_error_and_same_step_a_no_op(tmp_path):
    ckpt = save_steps(tmp_path, [5])
    assert ckpt.save(5, make_state(5), config=CONFIG) is False
    with pytest.raises(CheckpointError, match=r"cannot save step 3: .*newer checkpoint \(step 5\)"):
        ckpt.save(3, make_state(3), config=CONFIG)
    ckpt.close()


# --------------------------------------------------------------------------- corruption


def test_flipped_bytes_are_caught_and_previous_step_used(tmp_path, caplog):
    save_steps(tmp_path, [1, 2]).close()
    path, offset = find_table_bytes(tmp_path, 2)
    data = bytearray(path.read_bytes())
    data[offset + 10] ^= 0xFF  # still readable, wrong value
    path.write_bytes(bytes(data))

    # Orbax alone restores the flipped byte silently; the hash is what catches it.
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ckpt = Checkpointer(tmp_path)
        restored, step = ckpt.restore(ABSTRACT)
    assert step == 1 and params_hash(restored) == params_hash(make_state(1))
    (line,) = corrupt_lines(caplog)
    assert line == "checkpoint step 2 is corrupt (array hash mismatch); falling back to step 1"
    # The corrupt step is moved aside, so training can save step 2 again.
    assert (tmp_path / "checkpoints" / "2.corrupt").is_dir()
    assert ckpt.latest_step() == 1
    ckpt.save(2, make_state(2), config=CONFIG)
    ckpt.close()
    assert Checkpointer(tmp_path).restore(ABSTRACT)[1] == 2


def test_unreadable_data_file_falls_back(tmp_path, caplog):
    save_steps(tmp_path, [1, 2]).close()
    path, _ = find_table_bytes(tmp_path, 2)
    path.write_bytes(path.read_bytes()[:100])  # truncated: cannot be read
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        config, params, step = load_for_inference(tmp_path)  # read-only: nothing moved
    assert params_hash(params) == params_hash(make_state(1)["params"])
    assert load_for_inference(tmp_path)[2] == step == 1
    (line, _) = corrupt_lines(caplog)
    assert line.startswith("checkpoint step 2 is corrupt (params unreadable: ")
    assert line.endswith("falling back to step 1") and "\n" not in line
    assert step_dir(tmp_path, 2).is_dir()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, step = Checkpointer(tmp_path).restore(ABSTRACT)
    assert step == 1
    (line,) = corrupt_lines(caplog)
    assert line.startswith("checkpoint step 2 is corrupt (state unreadable: ")


@pytest.mark.parametrize("damage", ["no_metadata", "no_manifest", "no_state"])
def test_partial_step_is_skipped(tmp_path, caplog, damage):
    save_steps(tmp_path, [1, 2]).close()
    d = step_dir(tmp_path, 2)
    if damage == "no_metadata":
        shutil.rmtree(d / "metadata")
    elif damage == "no_manifest":
        for manifest in (d / "state").rglob("manifest.ocdbt"):
            manifest.unlink()
    else:
        shutil.rmtree(d / "state")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, step = Checkpointer(tmp_path).restore(ABSTRACT)
    assert step == 1
    (line,) = corrupt_lines(caplog)
    assert line.startswith("checkpoint step 2 is corrupt (") and "falling back to step 1" in line


def test_leftover_tmp_dir_is_never_the_latest(tmp_path, caplog):
    save_steps(tmp_path, [1, 2]).close()
    tmp = tmp_path / "checkpoints" / "3.orbax-checkpoint-tmp"
    shutil.copytree(step_dir(tmp_path, 2), tmp)  # even a complete-looking one
    (tmp / "state" / "_METADATA").write_text("garbage")
    assert load_config(tmp_path) == hashing.jsonable(CONFIG)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ckpt = Checkpointer(tmp_path)  # cleans up the tmp dir
        assert ckpt.latest_step() == 2
        assert ckpt.restore(ABSTRACT)[1] == 2
    assert not corrupt_lines(caplog)
    ckpt.save(3, make_state(3), config=CONFIG)  # waits for the cleanup first
    ckpt.close()
    assert not tmp.exists()
    restored, step = Checkpointer(tmp_path).restore(ABSTRACT)
    assert step == 3 and params_hash(restored) == params_hash(make_state(3))


def test_every_step_corrupt_is_an_error(tmp_path, caplog):
    save_steps(tmp_path, [1]).close()
    shutil.rmtree(step_dir(tmp_path, 1) / "state")
    with (
        caplog.at_level(logging.WARNING, logger=LOGGER),
        pytest.raises(CheckpointError, match=r"no good checkpoint in .*step 1: state unreadable"),
    ):
        Checkpointer(tmp_path).restore(ABSTRACT)
    (line,) = corrupt_lines(caplog)
    assert line.endswith("; no older checkpoint")
    assert step_dir(tmp_path, 1).is_dir()  # nothing moved without a good step


def test_explicit_corrupt_step_does_not_fall_back(tmp_path):
    save_steps(tmp_path, [1, 2]).close()
    shutil.rmtree(step_dir(tmp_path, 2) / "metadata")
    ckpt = Checkpointer(tmp_path)
    with pytest.raises(CheckpointError, match="checkpoint step 2 .* is corrupt"):
        ckpt.restore(ABSTRACT, step=2)
    with pytest.raises(CheckpointError, match=r"no checkpoint for step 9 .*available steps: 1, 2"):
        ckpt.restore(ABSTRACT, step=9)
    assert ckpt.restore(ABSTRACT, step=1)[1] == 1
    ckpt.close()


def test_kill_9_during_async_save_keeps_previous_step(tmp_path):
    helper = Path(__file__).with_name("_checkpoint_kill_helper.py")
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]
        ),
    )
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, str(helper), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert "STEP2_STARTED" in proc.stdout

    sys.path.insert(0, str(helper.parent))
    try:
        from _checkpoint_kill_helper import big_state
    finally:
        sys.path.remove(str(helper.parent))
    abstract = jax.eval_shape(lambda: big_state(0))
    ckpt = Checkpointer(tmp_path)
    restored, step = ckpt.restore(abstract)
    # Step 2 can only win if its save was finalized before the kill, and then it verifies.
    assert step in (1, 2)
    assert params_hash(restored) == params_hash(big_state(step))
    if step == 1:
        ckpt.save(2, big_state(2), config={"name": "kill", "model": {"d_model": 8}})
        ckpt.wait()
        assert ckpt.restore(abstract)[1] == 2
    ckpt.close()


# --------------------------------------------------------------------------- readable errors


def test_different_model_config_gives_a_readable_diff(tmp_path):
    ckpt = save_steps(tmp_path, [1])
    other = {**CONFIG, "model": {**CONFIG["model"], "d_model": 128}}
    with pytest.raises(CheckpointError) as err:
        ckpt.restore(ABSTRACT, config=other)
    assert str(err.value) == (
        "checkpoint was written by a different model config: "
        "model.d_model: 64 (checkpoint) != 128 (now)"
    )
    two = {**CONFIG, "model": {**CONFIG["model"], "d_model": 128, "num_layers": 4}}
    with pytest.raises(CheckpointError) as err:
        ckpt.restore(ABSTRACT, config=two)
    assert str(err.value).splitlines()[1:] == [
        "  model.d_model: 64 (checkpoint) != 128 (now)",
        "  model.num_layers: 2 (checkpoint) != 4 (now)",
    ]
    # Other sections (a longer run, another learning rate) may change on resume.
    longer = {**CONFIG, "train": {"steps": 20}}
    assert ckpt.restore(ABSTRACT, config=longer)[1] == 1
    ckpt.close()


def test_state_of_another_shape_gives_a_readable_error(tmp_path):
    ckpt = save_steps(tmp_path, [1])
    bigger = jax.eval_shape(lambda: {**make_state(0), "extra": jnp.zeros(3)})
    with pytest.raises(CheckpointError) as err:
        ckpt.restore(bigger)
    assert "\n" not in str(err.value)
    assert "missing from the checkpoint: extra" in str(err.value)
    wider = jax.eval_shape(lambda: {**make_state(0), "rng": jnp.zeros(4, jnp.uint32)})
    with pytest.raises(
        CheckpointError, match=r"rng: shape \(2,\) \(checkpoint\) != \(4,\) \(now\)"
    ):
        ckpt.restore(wider)
    other_dtype = jax.eval_shape(lambda: {**make_state(0), "step": jnp.zeros((), jnp.float32)})
    with pytest.raises(CheckpointError, match=r"step: dtype int32 \(checkpoint\) != float32"):
        ckpt.restore(other_dtype)
    ckpt.close()


# --------------------------------------------------------------------------- inference


def test_load_config_and_params_from_workdir_checkpoints_dir_or_step_dir(tmp_path):
    experiment = tconfig.Experiment(name="toy")
    ckpt = Checkpointer(tmp_path)
    for step in (1, 2):
        ckpt.save(step, make_state(step), config=experiment.to_dict())
    ckpt.close()
    assert tconfig.from_dict(load_config(tmp_path)) == experiment
    for where, step in [(tmp_path, 2), (tmp_path / "checkpoints", 2), (step_dir(tmp_path, 1), 1)]:
        config, params, _ = load_for_inference(where)
        assert tconfig.from_dict(config) == experiment
        assert_trees_equal(params, make_state(step)["params"])
    with pytest.raises(CheckpointError, match="does not exist"):
        load_config(tmp_path / "nope")
    for missing in (tmp_path / "checkpoints" / "999", f"{tmp_path}/checkpoints/3/"):
        with pytest.raises(CheckpointError) as err:  # a step that is not there: the ones that are
            load_for_inference(missing)
        step = Path(missing).name
        assert str(err.value) == (
            f"{tmp_path / 'checkpoints'} holds no checkpoint step {step}; its steps: 1, 2 "
            "(give one, or the workdir for the newest)"
        )
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        load_for_inference(tmp_path / "checkpoints" / "2" / "config")


# --------------------------------------------------------------------------- signals


def test_save_and_wait_from_a_signal_handler_do_not_deadlock(tmp_path):
    """SIGTERM arrives in the middle of save(); its handler saves and waits itself."""
    ckpt = Checkpointer(tmp_path)
    events = []

    def on_term(signum, frame):
        events.append("handler")
        ckpt.save(2, make_state(2), config=CONFIG)
        ckpt.wait()

    real_save = ckpt._mgr.save

    def save_interrupted(*args, **kwargs):
        ckpt._mgr.save = real_save
        os.kill(os.getpid(), signal.SIGTERM)  # lands inside save()
        events.append("orbax save started")
        out = real_save(*args, **kwargs)
        events.append("orbax save returned")
        return out

    previous = signal.signal(signal.SIGTERM, on_term)
    ckpt._mgr.save = save_interrupted
    # Only against a deadlock (which would hang the suite): far above any slow save, since
    # it ends the whole worker process with the stacks.
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    try:
        ckpt.save(1, make_state(1), config=CONFIG)
        events.append("save returned")
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGTERM, previous)
    # The handler ran once orbax was done with step 1, not in the middle of it.
    assert events == ["orbax save started", "orbax save returned", "handler", "save returned"]
    assert signal.getsignal(signal.SIGTERM) is previous
    assert ckpt.all_steps() == [1, 2]
    ckpt.close()


def test_two_corrupt_steps_fall_back_twice(tmp_path, caplog):
    save_steps(tmp_path, [1, 2, 3]).close()
    shutil.rmtree(step_dir(tmp_path, 3) / "state")
    shutil.rmtree(step_dir(tmp_path, 2) / "config")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ckpt = Checkpointer(tmp_path)
        restored, step = ckpt.restore(ABSTRACT)
    assert step == 1 and params_hash(restored) == params_hash(make_state(1))
    assert corrupt_lines(caplog) == [
        'checkpoint step 3 is corrupt (state unreadable: item "state" is missing); '
        "falling back to step 2",
        'checkpoint step 2 is corrupt (metadata/config unreadable: item "config" is missing); '
        "falling back to step 1",
    ]
    assert ckpt.all_steps() == [1]
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.corrupt")) == [
        "2.corrupt",
        "3.corrupt",
    ]
    ckpt.close()


@pytest.mark.parametrize("main", [True, False], ids=["process_0", "process_1"])
def test_with_several_processes_process_0_alone_moves_a_corrupt_step(tmp_path, monkeypatch, main):
    """Every process of a run finds the same corrupt step; process 0 renames it, the others
    leave it, and all meet at one barrier before they reload the listing."""
    import tfmjax.checkpoint.store as store

    save_steps(tmp_path, [1, 2]).close()
    shutil.rmtree(step_dir(tmp_path, 2) / "state")
    barriers = []
    monkeypatch.setattr(store, "is_main", lambda: main)
    monkeypatch.setattr(store, "barrier", barriers.append)
    ckpt = Checkpointer(tmp_path)
    _, step = ckpt.restore(ABSTRACT)
    assert step == 1 and len(barriers) == 1
    assert (tmp_path / "checkpoints" / "2.corrupt").is_dir() is main
    assert step_dir(tmp_path, 2).is_dir() is not main
    ckpt.close()
