"""Helper for test_save_faults.py: save faults in a fresh process, where nothing but our
own lines may reach stderr (absl logs to stderr there, unlike under pytest's log capture).

Usage: python _save_fault_helper.py WORKDIR SCENARIO
  quiet       save with best_metric, without and with metrics: no output at all
  background  the metadata write of step 2 raises ENOSPC in orbax's background thread;
              the save of step 3 reports it
  permission  the checkpoints directory is made read-only (run as root, start this helper
              without CAP_DAC_OVERRIDE, e.g. under ``setpriv --bounding-set=-dac_override``)
Prints ``ERROR <message>`` for each CheckpointError and ``STEPS <steps>`` at the end.
"""

import errno
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

from tfmjax.checkpoint import Checkpointer, CheckpointError  # noqa: E402

CONFIG = {"name": "faults", "model": {"d_model": 8}}


def small_state(seed: int) -> dict:
    table = jax.random.bits(jax.random.key(seed), (64, 64), jnp.uint32)
    return {"params": {"table": table}, "step": jnp.int32(seed)}


def fail_metadata_of_step(step: int) -> None:
    real = ocp.JsonCheckpointHandler._save_fn

    async def faulty(self, item, directory):
        if isinstance(item, dict) and item.get("step") == step and "state_hash" in item:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory))
        return await real(self, item, directory)

    ocp.JsonCheckpointHandler._save_fn = faulty


def main(workdir: str, scenario: str) -> None:
    ckpt = Checkpointer(workdir, keep=3, best_metric="loss", best_mode="min")
    if scenario == "background":
        fail_metadata_of_step(2)
    try:
        ckpt.save(1, small_state(1), config=CONFIG)
        ckpt.wait()
        if scenario == "permission":
            os.chmod(ckpt.checkpoints_dir, 0o555)
        for step in (2, 3):
            try:
                metrics = {"loss": 1.0 / step} if step == 3 else None
                ckpt.save(step, small_state(step), config=CONFIG, metrics=metrics)
            except CheckpointError as err:
                print(f"ERROR {err}", flush=True)
        ckpt.close()
    finally:
        os.chmod(ckpt.checkpoints_dir, 0o755)
    print("STEPS " + " ".join(map(str, Checkpointer(workdir).all_steps())), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
