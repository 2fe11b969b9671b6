"""The interpretability demos of docs/studies.md, end to end: train the two runs if missing,
take them apart with ``python -m tfmjax.interp``, copy the figures to ``docs/`` and print
the numbers that page quotes.

    python experiments/interp_demo.py            # about 6 minutes on a 2-core CPU

1. ``induction_head_decoder`` with a checkpoint every 200 steps (40 kept): head scores,
   the heads of the circuit mean-ablated together and one at a time, composition scores
   between the previous-token head and the layer-1 heads, the scores across checkpoints.
2. ``reverse`` (encoder-decoder): cross-attention share on the mirrored source position,
   patching of each layer's cross-attention output from clean into prompt-resampled runs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs" / "interp"
DOCS = ROOT / "docs"
RUN_ARGS = {
    "induction_head_decoder": [
        "train.checkpoint_every=200",
        "train.keep_checkpoints=50",
        "train.eval_every=500",
    ],
    "reverse": [],
}


def sh(*args: str) -> None:
    print("$", " ".join(args), flush=True)
    subprocess.run([sys.executable, *args], cwd=ROOT, check=True)


def train(name: str) -> Path:
    workdir = RUNS / name
    if not (workdir / "checkpoints").is_dir():
        config = f"configs/{name}.toml"
        sh("train.py", config, *RUN_ARGS[name], f"train.workdir={workdir}", "--progress", "lines")
    return workdir


def interp(workdir: Path, *args: str) -> dict:
    sh("-m", "tfmjax.interp", str(workdir), *args)
    return json.loads((workdir / "interp" / "interp.json").read_text())


def composition(workdir: Path, layer0_head: int) -> dict:
    """Q/K/V-composition scores of the previous-token head (layer 0) with each layer-1 head,
    next to the mean over every layer-0 head."""
    from tfmjax.interp.analyses import load_run
    from tfmjax.interp.circuits import composition_scores

    run = load_run(workdir)
    scores = composition_scores(run.model, run.params)
    return {
        kind: {
            "previous_token_head": np.asarray(grid[0, layer0_head, 1]).round(3).tolist(),
            "mean_layer0_head": np.asarray(grid[0, :, 1].mean(0)).round(3).tolist(),
        }
        for kind, grid in scores.items()
    }


def main() -> None:
    induction = train("induction_head_decoder")
    interp(induction, "heads")
    interp(induction, "phase")
    interp(induction, "sae", "--layer", "0")
    report = interp(induction, "ablate")
    top = report["heads"]["decoder"]["top"]["previous_token"]
    report["composition"] = composition(induction, top["head"])
    reverse = train("reverse")
    interp(reverse, "patterns", "--alignment", "mirror", "--example", "3")
    interp(reverse, "dla")
    rev = interp(reverse, "patch", "--per", "layer", "--hooks", "hook_cross_attn_out,hook_mlp_out")
    figures = {
        induction / "interp" / "heads_decoder.png": "interp_induction_heads.png",
        induction / "interp" / "phase.png": "interp_induction_phase.png",
        induction / "interp" / "ablate_decoder_attn.png": "interp_induction_ablation.png",
        reverse / "interp" / "decoder_blocks_1_cross_attn.png": "interp_reverse_cross.png",
    }
    for source, name in figures.items():
        shutil.copy(source, DOCS / name)
    summary = {
        "induction": {
            "top": report["heads"]["decoder"]["top"],
            "phase_jump": report["phase"]["largest_jump"],
            "ablation": {k: v for k, v in report["ablate"].items() if k != "heads_by_score"},
            "composition": report["composition"],
            "sae": report["sae"],
        },
        "reverse": {"alignment": rev["patterns"]["alignment"], "patch": rev["patch"]},
    }
    (ROOT / "experiments" / "results" / "interp_demo.json").write_text(
        json.dumps(summary, indent=1) + "\n"
    )
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
