"""Every command-line entry point has a working --help; the config explainer and preset rule."""

import importlib.util
from pathlib import Path

import pytest

from tfmjax import generate, summary
from tfmjax.config import SECTIONS, explain, load
from tfmjax.sweep import cli as sweep_cli
from tfmjax.train import plots

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ENTRY_POINTS = {
    "train.py": lambda: _script("train").main,
    "eval.py": lambda: _script("eval").main,
    "tfmjax.generate": lambda: generate.main,
    "tfmjax.summary": lambda: summary.main,
    "tfmjax.train.plots": lambda: plots.main,
    "tfmjax.config.explain": lambda: explain.main,
    "tfmjax.sweep": lambda: sweep_cli.main,
}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_help_exits_zero_and_describes_usage(name, capsys):
    with pytest.raises(SystemExit) as info:
        ENTRY_POINTS[name]()(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and len(out.splitlines()) > 3


def test_every_config_key_has_help():
    """The help line sits beside each field, in ``dataclasses.field(metadata={"help": ...})``."""
    import dataclasses

    fields = {f"{s}.{f.name}": f for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    missing = [key for key, f in fields.items() if not f.metadata.get("help")]
    assert not missing, f"config fields without help: {missing}"


def test_explain_lists_keys_tasks_and_presets(capsys):
    assert explain.main([str(ROOT / "configs/reverse.toml"), "train.steps=7"]) == 0
    out = capsys.readouterr().out
    assert "train.steps" in out and " 7 " in out  # the value this config uses
    assert "associative_recall" in out and "gpt2-small" in out
    assert explain.main(["no/such.toml"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_preset_override_replaces_the_files_model_keys():
    path = ROOT / "configs/reverse.toml"
    gpt2 = load(path, ["model.preset=gpt2-small"]).model
    assert (gpt2.d_model, gpt2.num_layers, gpt2.vocab_size) == (768, 12, 50257)
    assert summary.count_params(gpt2) == 124_439_808  # GPT-2 small, as published
    tweaked = load(path, ["model.preset=gpt2-small", "model.num_layers=2"]).model
    assert (tweaked.d_model, tweaked.num_layers) == (768, 2)  # the command line still applies
    assert load(path).model.d_model != 768  # without the override: the file


def test_a_directory_is_not_a_config(tmp_path):
    from tfmjax.config import ConfigError

    with pytest.raises(ConfigError, match="is a directory; pass a TOML file"):
        load(tmp_path)


def test_train_takes_overrides_after_options(capsys):
    """``train.py CONFIG --progress lines key=value``: the override after an option is read
    (here a bad one, refused in one line with exit 2 before anything trains)."""
    main = _script("train").main
    code = main(
        [str(ROOT / "configs/reverse.toml"), "--progress", "lines", "model.activation=swish"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "model.activation='swish' is invalid" in err and "unrecognized" not in err
