"""``python -m tfmjax.interp WORKDIR COMMAND`` on a checkpointed run: every command writes its
PNGs and its report section, with numbers that hold together; errors are one line."""

import json

import numpy as np
import pytest

from tfmjax.config import DataConfig, Experiment
from tfmjax.interp.cli import main

TASK_PARAMS = {"max_len": 5, "num_symbols": 6}


@pytest.fixture(scope="module")
def workdir(trained, tmp_path_factory):
    """Two checkpoints of the reverse encoder-decoder: step 1 untrained-ish, step 2 trained."""
    from tfmjax.checkpoint import Checkpointer

    _, model, params, _ = trained("encoder_decoder")
    exp = Experiment(
        name="interp", model=model.config, data=DataConfig(task="reverse", task_params=TASK_PARAMS)
    )
    path = tmp_path_factory.mktemp("interp_cli")
    ckpt = Checkpointer(path)
    scrambled = {"params": _scale(params["params"], 0.1)}
    ckpt.save(1, {"params": scrambled}, config=exp.to_dict())
    ckpt.save(2, {"params": params}, config=exp.to_dict())
    ckpt.close() if hasattr(ckpt, "close") else ckpt.wait()
    return path


def _scale(tree, factor):
    import jax

    return jax.tree.map(lambda x: x * factor, tree)


def _report(path):
    return json.loads((path / "interp" / "interp.json").read_text())


def test_every_command_writes_pngs_and_a_report(workdir, capsys):
    out = workdir / "interp"
    commands = [
        ["heads", "--length", "4"],
        ["patterns", "--alignment", "mirror"],
        ["dla"],
        ["patch", "--per", "layer", "--hooks", "hook_cross_attn_out,encoder:hook_resid_post"],
        ["ablate", "--length", "4"],
        ["sae", "--features", "32", "--steps", "50", "--batches", "2"],
        ["phase", "--length", "4"],
    ]
    printed = {}
    for command in commands:
        capsys.readouterr()
        assert main([str(workdir), *command, "--batch-size", "16"]) == 0, command
        printed[command[0]] = capsys.readouterr().out.splitlines()
    report = _report(workdir)
    # What each command prints: the files it wrote, then a few readable lines of its report.
    for name, lines in printed.items():
        assert lines[0].startswith(f"{name}: wrote ") and lines[0].endswith(f" in {out}/")
        assert "interp.json" in lines[0] and len(lines) >= 2, lines
        assert all(line.startswith("  ") and len(line) < 400 for line in lines[1:]), lines
    assert "heads_decoder.png" in printed["heads"][0] and "dla.png" in printed["dla"][0]
    top = report["heads"]["decoder"]["top"]["previous_token"]
    assert f"previous_token L{top['layer']}H{top['head']} {top['score']:.3f}" in "".join(
        printed["heads"]
    )
    name, value = report["dla"]["top"][0]
    assert printed["dla"][1] == (
        f"  answer logit {report['dla']['answer_logit']:.3f} = sum of the parts "
        f"{report['dla']['sum']:.3f}"
    )
    assert printed["dla"][2].startswith(f"  largest parts: {name} {value:+.3f}, ")
    assert f"loss recovered {report['sae']['loss_recovered']:.3f}" in printed["sae"][1]
    assert printed["phase"][1].startswith("  2 checkpoints; largest jumps: ")
    assert set(report) == {"heads", "patterns", "dla", "patch", "ablate", "sae", "phase"}
    pngs = {p.name for p in out.glob("*.png")}
    assert {"heads_encoder.png", "heads_decoder.png", "dla.png", "phase.png"} <= pngs
    assert "decoder_blocks_1_cross_attn.png" in pngs
    assert any(name.startswith("patch_") for name in pngs)
    assert any(name.startswith("ablate_") for name in pngs)
    # The numbers hold together.
    dla = report["dla"]
    assert abs(dla["sum"] - dla["answer_logit"]) < 1e-2 * max(1.0, abs(dla["answer_logit"]))
    share = np.asarray(report["patterns"]["alignment"]["share"])
    assert share.shape == (2, 4) and share.min() >= 0 and share.max() <= 1
    grid = report["patch"]["grids"]["encoder:hook_resid_post"]
    np.testing.assert_allclose(grid, 1.0, atol=1e-3)  # the encoder output is all the source
    assert report["phase"]["steps"] == [1, 2]
    assert report["ablate"]["single_head_ablations"]["baseline"] > 0.7
    sae = report["sae"]
    assert sae["metrics"]["l0"] >= 0 and sae["training_rows"] > 0
    assert set(sae["answer_loss"]) == {"clean", "spliced", "zero_ablated"}


def test_errors_are_one_line(workdir, tmp_path, capsys):
    assert main([str(tmp_path / "missing"), "heads"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "does not exist" in err and "\n" not in err
    assert main([str(workdir), "patch", "--hooks", "attn.hook_nothing"]) == 2
    err = capsys.readouterr().err.strip()
    assert "hook_nothing" in err and "\n" not in err
