"""One-off: move the stored study results from the old config hash to the stable one.

    python tools/rehash_studies.py            # rewrite the records that are still valid
    python tools/rehash_studies.py --check    # only count them, write nothing

Until November 2026, ``experiments/sweep.py``'s ``config_hash`` hashed the whole
``Experiment.to_dict()`` (workdir and mesh left out), so every config field added since a
result was stored made it stale, although a new field comes at a default that reproduces
the old behaviour. ``config_hash`` now hashes only the non-default fields. The results in
``experiments/results/`` were all stored before the first field added after commit 2412aca
(ff70c83, 2026-11-25); the fields added since are :data:`ADDED_SINCE_2412ACA` (from
``git log -p tfmjax/config``; a field added after this tool would join them). A record's
legacy hash is the old hash of today's config without those fields (the old code at 2412aca
gives addition-seed0 7a87a69057e02c58, and so does :func:`legacy_hash`). Where the legacy
hash equals the stored one, the config is the one that was trained, and the record's hash
is rewritten to :func:`sweep.config_hash`; every other record is left as it is (stale: its
config changed for real since, and the study trains it again). Run on 2026-11-26: tasks 54
of 54 and attention 12 of 12 migrated; attempts 4 of 45 (27 written by hand with no hash,
14 of configs edited since they ran); length 0 of 66 (every training config hash matches,
but the study has changed since: ``model.max_len`` 72, not 64, and a 4x test length).

The records: ``tasks/`` and ``attempts/`` keep ``config``, ``overrides`` and
``config_hash``; ``attention/`` the same but ``config`` (its task's:
``attention_systems.TASKS``); ``length/`` keeps them under ``train`` and its own ``hash`` of
the config hash, the test lengths and the eval examples (``length_generalisation.run_hash``).
An attempt record written by hand has no hash: it never counts as current and is left as it
is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import attention_systems  # noqa: E402
import length_generalisation as length  # noqa: E402
from sweep import _hash, config_hash  # noqa: E402

from tfmjax.config import load  # noqa: E402

RESULTS = ROOT / "experiments" / "results"
STUDIES = ("tasks", "attention", "attempts", "length")

# Fields added to tfmjax/config after 2412aca (2026-11-24 18:03), all at defaults that
# reproduce the old behaviour: ff70c83 (token ids), b223339 (steps per call, prefetch),
# fbd13c5 (MoE), 083c8c6 (schedule_steps), 121d49c (positions), 509a1ff (retention,
# selective scan). mesh.expert came too; the mesh is not hashed.
ADDED_SINCE_2412ACA = {
    "model": (
        "pad_id",
        "eos_id",
        "prompt_bos",
        "moe_experts",
        "moe_top_k",
        "moe_every",
        "moe_capacity_factor",
        "moe_renormalize",
        "moe_aux_loss_weight",
        "moe_z_loss_weight",
        "position_sampling",
        "max_position",
        "abacus_max_offset",
        "digit_first_id",
        "fire_hidden",
        "ssm_state",
        "ssm_expand",
        "ssm_conv",
    ),
    "optim": ("schedule_steps",),
    "train": ("steps_per_call", "prefetch"),
}


def legacy_hash(config: str, overrides: list[str]) -> str:
    """The hash the old ``config_hash`` gave this config before the fields above came."""
    raw = load(ROOT / config, overrides).to_dict()
    raw["train"]["workdir"] = ""
    raw.pop("mesh", None)
    for section, names in ADDED_SINCE_2412ACA.items():
        for name in names:
            raw[section].pop(name)
    return _hash(raw)


def length_hash(record: dict, config_digest: str) -> str:
    """A length record's ``hash`` with ``config_digest`` as its config hash."""
    key = {
        "config": config_digest,
        "lengths": length.lengths_of(record["task"]),
        "examples": length.EVAL_EXAMPLES,
    }
    return _hash(key)


def rehash(path: Path, study: str, write: bool) -> str:
    """``current`` (already the stable hash), ``migrated``, ``stale`` or ``unhashed`` (a
    record written by hand, with no hash to check: never current, left as it is)."""
    record = json.loads(path.read_text())
    if "hash" not in record and "config_hash" not in record:
        return "unhashed"
    run = record["train"] if study == "length" else record
    # attention/ records name no config: their task's (attention_systems.TASKS)
    config = run.get("config") or attention_systems.TASKS[record["task"]]
    overrides = list(run["overrides"])
    new = config_hash(config, overrides)
    if study == "length":
        stored_key = "hash"
        stored, legacy, stable = (
            record["hash"],
            length_hash(record, legacy_hash(config, overrides)),
            length_hash(record, new),
        )
    else:
        stored_key = "config_hash"
        stored, legacy, stable = record["config_hash"], legacy_hash(config, overrides), new
    if stored == stable:
        return "current"
    if stored != legacy:
        return "stale"
    record[stored_key] = stable
    run["config_hash"] = new
    if write:
        path.write_text(json.dumps(record, indent=2) + "\n")
    return "migrated"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="count only, rewrite nothing")
    args = p.parse_args(argv)
    for study in STUDIES:
        counts = {"current": 0, "migrated": 0, "unhashed": 0, "stale": []}
        for path in sorted((RESULTS / study).glob("*.json")):
            state = rehash(path, study, write=not args.check)
            if state == "stale":
                counts["stale"].append(path.stem)
            else:
                counts[state] += 1
        stale = counts["stale"]
        print(
            f"{study}: {counts['current']} current, {counts['migrated']} migrated, "
            f"{counts['unhashed']} without a hash, {len(stale)} stale"
            + (f": {', '.join(stale)}" if stale else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
