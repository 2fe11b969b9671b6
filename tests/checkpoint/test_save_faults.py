"""Faults during a save: one line naming the failed step, the directory and the cause; the
earlier steps intact; no tmp dir left; orbax's tracebacks in checkpoints.log, not on stderr.

Also: a normal save (with or without metrics) prints nothing.

Real faults where the sandbox allows them (we run as root, so chmod alone stops nothing): a
small tmpfs that fills up (ENOSPC) or is remounted read-only (EROFS), and a subprocess without
CAP_DAC_OVERRIDE for permission denied. Faults injected in orbax's background write (the
metadata item) always run.
"""

import errno
import gc
import logging
import os
import shutil
import subprocess
import sys
import types
import uuid
from pathlib import Path

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest

from tfmjax.checkpoint import Checkpointer, CheckpointError, params_hash
from tfmjax.checkpoint.errors import save_cause

# A failed write can leave tensorstore calling back into orbax's closed event loop; while a
# checkpointer is open those go to checkpoints.log, after it is closed pytest may see them.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

CONFIG = {"name": "faults", "model": {"d_model": 8}}
HELPER = Path(__file__).with_name("_save_fault_helper.py")
HANG_S = 600  # a hang guard for the helper process, not a speed limit


def make_state(seed: int, n: int = 64) -> dict:
    """params (an incompressible uint32 table: its size on disk is 4 n^2 bytes) and a step."""
    table = jax.random.bits(jax.random.key(seed), (n, n), jnp.uint32)
    return {"params": {"table": table}, "step": jnp.int32(seed)}


def abstract(n: int = 64):
    return jax.eval_shape(lambda: make_state(0, n))


def assert_restores(ckpt: Checkpointer, step: int, n: int = 64) -> None:
    restored, got = ckpt.restore(abstract(n))
    assert got == step
    assert params_hash(restored) == params_hash(make_state(step, n))


def tmp_dirs(workdir: Path) -> list[str]:
    return sorted(p.name for p in (workdir / "checkpoints").glob("*.orbax-checkpoint-tmp"))


def assert_quiet(capfd, caplog) -> None:
    """Nothing on stderr, no WARNING+ record from any logger (orbax's go to the file)."""
    gc.collect()  # abandoned orbax coroutines report now, while we look
    err = capfd.readouterr().err
    assert "Traceback" not in err and "absl" not in err, err[-3000:]
    loud = [f"{r.name}: {r.getMessage()[:200]}" for r in caplog.records if r.levelno >= 30]
    assert not loud, loud


def assert_one_line(err: CheckpointError, step: int, workdir: Path, cause: str) -> str:
    message = str(err)
    assert "\n" not in message
    assert message.startswith(f"saving checkpoint step {step} to {workdir / 'checkpoints'} ")
    assert f"failed: {cause}" in message
    return message


@pytest.fixture
def fail_metadata_write(monkeypatch):
    """``fail_metadata_write(step, kind)``: the metadata write of ``step`` fails in orbax's
    background thread: ``enospc`` or ``eacces`` raise, ``removed`` deletes the directory it
    is about to write into (a real FileNotFoundError follows)."""
    real = ocp.JsonCheckpointHandler._save_fn

    def arm(step: int, kind: str) -> None:
        async def faulty(self, item, directory):
            if isinstance(item, dict) and item.get("step") == step and "state_hash" in item:
                if kind == "enospc":
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))
                if kind == "eacces":
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(directory))
                shutil.rmtree(directory)
            return await real(self, item, directory)

        monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", faulty)

    yield arm
    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", real)


CAUSES = {
    "enospc": "no space left on device: free space there or set train.workdir",
    "eacces": "permission denied: make the directory writable",
    "removed": "the directory was removed while saving",
}


# --------------------------------------------------------------------------- injected faults


@pytest.mark.parametrize("kind", sorted(CAUSES))
@pytest.mark.parametrize("surfaces_at", ["save", "wait"])
def test_background_fault_names_the_failed_step(
    tmp_path, fail_metadata_write, capfd, caplog, kind, surfaces_at
):
    caplog.set_level(logging.WARNING)
    ckpt = Checkpointer(tmp_path, keep=3)
    ckpt.save(1, make_state(1), config=CONFIG)
    ckpt.wait()
    fail_metadata_write(2, kind)
    assert ckpt.save(2, make_state(2), config=CONFIG)  # fails later, in the background
    with pytest.raises(CheckpointError) as info:
        if surfaces_at == "save":
            ckpt.save(3, make_state(3), config=CONFIG)  # not step 3's fault: step 2's
        else:
            ckpt.wait()
    message = assert_one_line(info.value, 2, tmp_path, CAUSES[kind])
    assert message.endswith(f" (orbax log: {tmp_path / 'checkpoints.log'})")
    assert "Traceback" in (tmp_path / "checkpoints.log").read_text()
    assert tmp_dirs(tmp_path) == []
    assert ckpt.all_steps() == [1]
    assert_restores(ckpt, 1)
    # The checkpointer goes on: the next save works (the fault was one-off).
    ckpt.save(3, make_state(3), config=CONFIG)
    ckpt.close()
    assert ckpt.all_steps() == [1, 3]
    assert_quiet(capfd, caplog)


def test_fault_reported_by_close_and_only_once(tmp_path, fail_metadata_write, capfd, caplog):
    caplog.set_level(logging.WARNING)
    ckpt = Checkpointer(tmp_path)
    fail_metadata_write(1, "enospc")
    ckpt.save(1, make_state(1), config=CONFIG)
    with pytest.raises(CheckpointError, match=r"^saving checkpoint step 1 to .* no space left"):
        ckpt.close()
    ckpt.close()  # closed anyway: no second error
    assert tmp_dirs(tmp_path) == [] and ckpt.all_steps() == []
    assert_quiet(capfd, caplog)


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "no space left on device"),
        (
            ValueError(
                'RESOURCE_EXHAUSTED: Error writing "params.t/0.0" in OCDBT database at local '
                'file "/x/checkpoints/3.orbax-checkpoint-tmp/state/": Failed to write 242 bytes'
                " to file 4: No space left on device [os_error_code='28']"
            ),
            "no space left on device",
        ),
        (ValueError("RESOURCE_EXHAUSTED: Error writing local file"), "no space left on device"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk quota exceeded"),
        (OSError(errno.EROFS, "Read-only file system"), "read-only file system"),
        (PermissionError(errno.EACCES, "Permission denied"), "permission denied"),
        (ValueError('PERMISSION_DENIED: Error opening file "/x"'), "permission denied"),
        (OSError(errno.ENOTDIR, "Not a directory"), "not a directory (a file is in the way)"),
        (FileNotFoundError(errno.ENOENT, "No such file"), "the directory was removed"),
        (ValueError('NOT_FOUND: Error reading "/x/manifest.ocdbt"'), "the directory was removed"),
        (ValueError("something else"), "ValueError: something else"),
    ],
)
def test_save_cause_in_plain_words(error, cause):
    assert save_cause(error).startswith(cause)
    wrapped = RuntimeError("orbax wrapper")
    wrapped.__cause__ = error
    assert save_cause(wrapped).startswith(cause.split(":")[0])


def test_orbax_leftovers_go_to_the_log_file(tmp_path):
    """tensorstore calling into orbax's closed event loop: reported via sys.unraisablehook."""
    ckpt = Checkpointer(tmp_path)
    try:
        raise RuntimeError("Event loop is closed")
    except RuntimeError as err:
        leftover = err
    sys.unraisablehook(
        types.SimpleNamespace(
            exc_type=RuntimeError,
            exc_value=leftover,
            exc_traceback=leftover.__traceback__,
            err_msg=None,
            object=None,
        )
    )
    ckpt.close()
    assert "RuntimeError: Event loop is closed" in (tmp_path / "checkpoints.log").read_text()


# --------------------------------------------------------------------------- quiet saves


def test_saves_with_and_without_metrics_print_nothing(tmp_path, capfd, caplog):
    caplog.set_level(logging.DEBUG, logger="absl")  # orbax's INFO chatter included
    caplog.set_level(logging.WARNING)
    ckpt = Checkpointer(tmp_path, keep=2, best_metric="loss", best_mode="min")
    ckpt.save(1, make_state(1), config=CONFIG)  # not an eval step: no metrics
    ckpt.save(2, make_state(2), config=CONFIG, metrics={"loss": 0.5})
    ckpt.save(3, make_state(3), config=CONFIG, metrics=None)  # e.g. the save on SIGTERM
    ckpt.close()
    assert ckpt.all_steps() == [2, 3]
    absl = [r.getMessage() for r in caplog.records if r.name == "absl"]
    assert not absl, absl[:5]
    assert_quiet(capfd, caplog)
    log_file = tmp_path / "checkpoints.log"  # orbax's INFO lines went there, if any
    assert not log_file.exists() or "tracked_metric" not in log_file.read_text()


# --------------------------------------------------------------------------- real faults


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs (needs mount rights: root in this sandbox); unmounted afterwards."""
    mnt = tmp_path / "small_fs"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", f"tfmjax-{uuid.uuid4().hex[:8]}", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.strip() or proc.returncode}")
    try:
        yield mnt
    finally:
        gc.collect()
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_disk_full(small_fs, capfd, caplog):
    """640 KB per step on a 1 MiB file system: step 1 fits, step 2 does not."""
    caplog.set_level(logging.WARNING)
    workdir = small_fs / "run"
    n = 400
    ckpt = Checkpointer(workdir, keep=3)
    ckpt.save(1, make_state(1, n), config=CONFIG)
    ckpt.wait()
    ckpt.save(2, make_state(2, n), config=CONFIG)
    with pytest.raises(CheckpointError) as info:
        ckpt.wait()
    message = assert_one_line(info.value, 2, workdir, CAUSES["enospc"])
    # Written once the half-written step was removed and space was free again.
    assert message.endswith(f" (orbax log: {workdir / 'checkpoints.log'})")
    assert "No space left on device" in (workdir / "checkpoints.log").read_text()
    assert tmp_dirs(workdir) == []
    assert ckpt.all_steps() == [1]
    assert_restores(ckpt, 1, n)
    ckpt.close()
    assert_quiet(capfd, caplog)


def test_read_only_file_system(small_fs, capfd, caplog):
    caplog.set_level(logging.WARNING)
    workdir = small_fs / "run"
    ckpt = Checkpointer(workdir, keep=3)
    ckpt.save(1, make_state(1), config=CONFIG)
    ckpt.wait()
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    try:
        with pytest.raises(CheckpointError) as info:
            ckpt.save(2, make_state(2), config=CONFIG)  # the step dir is made in save()
        message = assert_one_line(info.value, 2, workdir, "read-only file system: remount it")
        assert "orbax log" not in message  # it could not be written
        assert ckpt.all_steps() == [1]
        assert_restores(ckpt, 1)
        ckpt.close()
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_fs)], check=True)
    assert tmp_dirs(workdir) == []
    assert_quiet(capfd, caplog)


# --------------------------------------------------------------------------- a fresh process


def run_helper(workdir: Path, scenario: str, prefix: tuple[str, ...] = ()):
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        PYTHONPATH=os.pathsep.join(
            [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]
        ),
    )
    env.pop("XLA_FLAGS", None)
    return subprocess.run(
        [*prefix, sys.executable, str(HELPER), str(workdir), scenario],
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def without_root_override() -> tuple[str, ...]:
    """A command prefix under which chmod binds (root without CAP_DAC_OVERRIDE)."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    caps = "-dac_override,-dac_read_search,-fowner"
    if setpriv is None or subprocess.run([setpriv, f"--bounding-set={caps}", "true"]).returncode:
        pytest.skip("root here, and setpriv cannot drop CAP_DAC_OVERRIDE: chmod would not bind")
    return (setpriv, f"--bounding-set={caps}")


def test_in_a_fresh_process_stderr_stays_empty(tmp_path):
    """Outside pytest absl logs to stderr: a fault there prints our line only, a normal save
    nothing at all; permission denied is a real one (chmod binds once root's override is
    dropped)."""
    proc = run_helper(tmp_path / "quiet", "quiet")
    assert (proc.returncode, proc.stderr, proc.stdout) == (0, "", "STEPS 1 2 3\n")

    proc = run_helper(tmp_path / "bg", "background")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    ckpts = tmp_path / "bg" / "checkpoints"
    assert proc.stdout.splitlines() == [
        f"ERROR saving checkpoint step 2 to {ckpts} failed: {CAUSES['enospc']} to a "
        f"larger disk (orbax log: {tmp_path / 'bg' / 'checkpoints.log'})",
        "STEPS 1",
    ]

    proc = run_helper(tmp_path / "perm", "permission", without_root_override())
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    ckpts = tmp_path / "perm" / "checkpoints"
    first, second, steps = proc.stdout.splitlines()
    assert first.startswith(
        f"ERROR saving checkpoint step 2 to {ckpts} failed: permission denied: "
    )
    assert second.startswith(f"ERROR saving checkpoint step 3 to {ckpts} failed: permission denied")
    assert steps == "STEPS 1"
    assert not list(ckpts.glob("*.orbax-checkpoint-tmp"))
