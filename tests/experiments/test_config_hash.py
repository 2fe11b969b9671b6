"""The studies' config hash (experiments/sweep.py) covers the non-default fields only: a
config field added at its default keeps every stored result current; a changed value does
not."""

import dataclasses
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments"))
import sweep  # noqa: E402
from sweep import config_hash  # noqa: E402

from tfmjax.config import SECTIONS, from_dict, load, loading  # noqa: E402

CONFIG = "configs/copy_decoder.toml"


def with_field(section: str, name: str, default):
    """``SECTIONS[section]`` with one more field, ``name``, defaulting to ``default``."""
    base = SECTIONS[section]
    return dataclasses.make_dataclass(
        base.__name__,
        [(name, type(default), dataclasses.field(default=default))],
        bases=(base,),
        frozen=True,
    )


@pytest.mark.parametrize(
    ("section", "name", "default"),
    [("model", "future_width", 7), ("train", "future_flag", False), ("optim", "future", 0.5)],
)
def test_a_field_added_at_its_default_changes_no_hash(monkeypatch, section, name, default):
    before = config_hash(CONFIG, ["train.seed=1"])
    cls = with_field(section, name, default)
    monkeypatch.setitem(SECTIONS, section, cls)
    if section == "model":  # the config's preset has the field too, as a real one would
        preset = loading.get_preset
        monkeypatch.setattr(loading, "get_preset", lambda p: cls(**dataclasses.asdict(preset(p))))
    assert name in load(ROOT / CONFIG).to_dict()[section]  # the field is really there
    assert config_hash(CONFIG, ["train.seed=1"]) == before
    # Set to its default explicitly: still the same config; to another value: another.
    assert config_hash(CONFIG, ["train.seed=1", f"{section}.{name}={default!r}".lower()]) == (
        before
    )
    other = {int: "8", bool: "true", float: "0.25"}[type(default)]
    assert config_hash(CONFIG, ["train.seed=1", f"{section}.{name}={other}"]) != before


def test_a_changed_value_changes_the_hash_and_the_workdir_and_mesh_do_not():
    base = config_hash(CONFIG, [])
    assert config_hash(CONFIG, ["train.seed=1"]) != base
    assert config_hash(CONFIG, ["model.d_model=32"]) != base
    assert config_hash(CONFIG, ["data.task_params.max_len=5"]) != base
    assert config_hash(CONFIG, ["train.workdir=/tmp/elsewhere", "mesh.data=-1"]) == base
    # A field given at its default value is the same config as one not given.
    assert config_hash(CONFIG, ["train.seed=0", "optim.b1=0.9"]) == base


def test_only_the_non_default_fields_are_hashed():
    raw = load(ROOT / CONFIG, ["train.seed=3", "model.num_kv_heads=2"]).to_dict()
    kept = sweep._non_default(raw)
    assert kept["name"] == "copy_decoder" and "mesh" not in kept
    assert kept["train"]["seed"] == 3 and "workdir" not in kept["train"]
    assert kept["model"]["num_kv_heads"] == 2
    assert "prefetch" not in kept["train"] and "moe_experts" not in kept["model"]
    # A preset counts through the values it sets, against ModelConfig()'s defaults (not the
    # preset's): the same hash as its values written out in the config's [model] table.
    preset = load(ROOT / CONFIG, ["model.preset=tiny-llama"]).to_dict()
    written = tomllib.loads((ROOT / CONFIG).read_text())
    written["model"] = sweep._non_default(preset)["model"]
    assert written["model"]["activation"] == "swiglu"  # one of the preset's values
    assert sweep._hash(sweep._non_default(from_dict(written, "copy_decoder").to_dict())) == (
        config_hash(CONFIG, ["model.preset=tiny-llama"])
    )
