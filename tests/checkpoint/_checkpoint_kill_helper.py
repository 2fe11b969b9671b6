"""Helper for test_checkpoint.py: save step 1, start saving step 2, then SIGKILL ourselves.

Usage: python _checkpoint_kill_helper.py WORKDIR
Prints ``STEP2_STARTED`` (flushed) right before the kill.
"""

import os
import signal
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from tfmjax.checkpoint import Checkpointer  # noqa: E402

N = 1 << 20  # 4 arrays x 1M uint32 = 16 MiB of incompressible data per step
CONFIG = {"name": "kill", "model": {"d_model": 8}}


def big_state(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    arrays = {
        f"w{i}": jnp.asarray(rng.integers(0, 2**32, size=(N,), dtype=np.uint32)) for i in range(4)
    }
    return {"params": arrays, "step": jnp.int32(seed)}


def main(workdir: str) -> None:
    ckpt = Checkpointer(workdir, keep=3)
    ckpt.save(1, big_state(1), config=CONFIG)
    ckpt.wait()
    ckpt.save(2, big_state(2), config=CONFIG)  # async: returns once arrays are on the host
    print("STEP2_STARTED", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no wait(), no atexit, no finally


if __name__ == "__main__":
    main(sys.argv[1])
