"""A failure inside training's evaluation (XLA refusing a program, an own task's code) ends
train.py in one line and exit 1, with the state of that step saved and loadable first."""

from pathlib import Path

import jax
import pytest

from tfmjax.checkpoint import load_for_inference
from tfmjax.train import loop

ROOT = Path(__file__).resolve().parents[2]
# What XLA:CPU says when a bfloat16 model decodes at batch > 1 (jax 0.10.2 and 0.11.2).
BF16 = "UNIMPLEMENTED: Unsupported element type for DotThunk::Execute: BF16 x BF16 = F32"


@pytest.mark.parametrize(
    "error, hint",
    [
        (jax.errors.JaxRuntimeError(BF16), "use model.dtype=float32"),
        (ZeroDivisionError("division by zero"), ""),
    ],
    ids=["xla", "task-code"],
)
def test_a_failed_evaluation_is_one_line_and_its_step_is_saved(
    tmp_path, monkeypatch, capsys, script_main, error, hint
):
    def failing(self, state, step):
        raise error

    monkeypatch.setattr(loop._Loop, "evaluate", failing)
    workdir = tmp_path / "run"
    args = [str(ROOT / "configs" / "reverse_decoder.toml"), f"train.workdir={workdir}"]
    args += ["model.d_model=16", "model.num_heads=2", "model.d_ff=32", "model.num_layers=1"]
    args += ["train.steps=4", "optim.warmup_steps=2", "train.log_every=2", "train.eval_every=4"]
    assert script_main("train")([*args, "train.checkpoint_every=100", "--progress", "lines"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("error: the evaluation at step 4 failed (")
    assert f"step 4 is saved: python eval.py {workdir} evaluates it once that is fixed" in err
    assert (hint in err) if hint else "(XLA:CPU" not in err
    assert load_for_inference(workdir)[2] == 4  # saved although checkpoint_every is 100
