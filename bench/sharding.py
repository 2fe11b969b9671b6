"""Memory per device of params + optimizer state under each mesh, against the ideal 1/n.

    python bench/sharding.py            # gpt2-small and vaswani-base, 8 simulated CPU devices
    python bench/sharding.py --quick    # the tiny presets (a smoke run)

Nothing is allocated: for each mesh ``data x fsdp x tensor`` and rule set, the train state
(float32 params + Adam's two moments) is laid out by :mod:`tfmjax.parallel` and measured two
ways that must agree: the bytes of the largest shard each leaf puts on a device (what
``addressable_shards`` hold once created) and XLA's compiled memory analysis of the sharded
init (its per-device output bytes). ``ideal`` is the whole state over the 8 devices.

A step time on the simulated devices closes the table: all 8 share this machine's cores,
so it shows that the sharded step runs, and is **not a speed figure**.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

from tfmjax.config import ConfigError, Experiment, MeshConfig, get_preset  # noqa: E402
from tfmjax.models import build  # noqa: E402
from tfmjax.parallel import Placement  # noqa: E402
from tfmjax.train.optimizer import make_optimizer  # noqa: E402
from tfmjax.train.state import _create, abstract_state, state_shardings  # noqa: E402

MESHES = [
    ((8, 1, 1), "standard"),
    ((1, 8, 1), "standard"),
    ((1, 1, 8), "standard"),
    ((2, 2, 2), "standard"),
    ((2, 4, 1), "standard"),
    ((1, 8, 1), "replicated"),
]


def state_bytes(preset: str, mesh, rules: str) -> dict:
    """Per-device bytes of the train state of ``preset`` on ``mesh``: by shard shapes, by
    the compiled init's memory analysis; and the whole state's bytes."""
    d, f, t = mesh
    exp = Experiment(model=get_preset(preset), mesh=MeshConfig(d, f, t, rules))
    exp = _with_batch(exp, 8 * d * f)
    placement = Placement.for_run(exp)
    model = build(exp.model)
    tx = make_optimizer(schedule=lambda step: 1e-3)
    batch = model.dummy_batch(exp.data.batch_size, 16)
    shardings = state_shardings(model, tx, batch, 0, placement)
    abstract = abstract_state(model, tx, batch, 0)
    leaves = zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings), strict=True)
    by_shards = whole = 0
    for leaf, sharding in leaves:
        per_device = 1
        for n in sharding.shard_shape(leaf.shape):
            per_device *= n
        by_shards += per_device * leaf.dtype.itemsize
        whole += leaf.size * leaf.dtype.itemsize
    init = jax.jit(functools.partial(_create, model, tx, seed=0), out_shardings=shardings)
    compiled = init.lower(batch).compile().memory_analysis()
    return {"shards": by_shards, "compiled": compiled.output_size_in_bytes, "whole": whole}


def _with_batch(exp: Experiment, batch_size: int) -> Experiment:
    import dataclasses

    return dataclasses.replace(exp, data=dataclasses.replace(exp.data, batch_size=batch_size))


def step_time(mesh) -> float:
    """Seconds per train step of the tiny decoder-only model on ``mesh`` (warm)."""
    from tfmjax.config import load
    from tfmjax.train.run import build_run
    from tfmjax.train.state import create_state

    d, f, t = mesh
    exp = load(
        "configs/reverse_decoder.toml",
        [f"mesh.data={d}", f"mesh.fsdp={f}", f"mesh.tensor={t}", "data.eval_examples=64"],
    )
    run = build_run(exp)
    state = create_state(run.model, run.tx, run.batch(0), 0, run.state_shardings)
    batch = run.device_batch(0)
    state, _ = run.train_step(state, batch)
    jax.block_until_ready(state)
    begin = time.perf_counter()
    for _ in range(20):
        state, _ = run.train_step(state, batch)
    jax.block_until_ready(state)
    return (time.perf_counter() - begin) / 20


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny presets only")
    args = parser.parse_args(argv)
    presets = ("tiny-gpt2", "tiny-vaswani") if args.quick else ("gpt2-small", "vaswani-base")
    print(f"{jax.device_count()} devices ({jax.devices()[0].platform})")
    print(
        "| preset | mesh (data x fsdp x tensor) | rules | per device (shards) "
        "| per device (compiled) | ideal whole/8 | ratio to ideal |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: |")
    for preset in presets:
        for mesh, rules in MESHES:
            try:
                b = state_bytes(preset, mesh, rules)
            except ConfigError as err:
                print(f"| {preset} | {' x '.join(map(str, mesh))} | {rules} | {err} | | | |")
                continue
            ideal = b["whole"] / jax.device_count()
            mib = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
            print(
                f"| {preset} | {' x '.join(map(str, mesh))} | {rules} | {mib(b['shards'])} "
                f"| {mib(b['compiled'])} | {mib(ideal)} | {b['shards'] / ideal:.2f} |",
                flush=True,
            )
    print(
        "\nstep time, tiny-gpt2 on reverse, batch 64: 8 simulated devices sharing the CPU "
        "(not a speed figure)"
    )
    for mesh in [(1, 1, 1), (8, 1, 1), (1, 8, 1), (2, 2, 2)]:
        print(
            f"  mesh {' x '.join(map(str, mesh))}: {step_time(mesh) * 1e3:.1f} ms/step", flush=True
        )


if __name__ == "__main__":
    main()
