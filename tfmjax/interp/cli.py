"""``python -m tfmjax.interp WORKDIR COMMAND [options]``: take a trained run apart.

Commands (each writes PNGs and its section of ``OUT/interp.json``; OUT defaults to
``WORKDIR/interp``):

  heads     previous-token, duplicate-token and induction scores per head (repeated random
            sequences of the task's symbols); ``heads.png``
  patterns  attention (and cross-attention) patterns of one eval example per layer;
            ``--alignment mirror|same`` adds the cross-attention share on the aligned source
  dla       direct logit attribution to the answer tokens; ``dla.png``
  patch     activation patching from clean into prompt-resampled runs, per layer x position
            (``--hooks``); ``patch_<hook>.png``
  ablate    the heads whose score passes ``--threshold``, mean-ablated together, next to
            each head ablated alone (teacher-forced exact-match = greedy); ``ablate_*.png``
  sae       a sparse autoencoder on one layer's residual stream, spliced back in
  phase     the induction score at every checkpoint kept; ``phase.png``

The config, params and task come from the checkpoint. An imported Hugging Face model has no
task: ``heads``, ``patterns`` and ``dla`` analyse your text (``--input "some text"``, read by
the model's own tokenizer, or ``--ids``) and label positions with its tokens.
A patch (image) model (``model.input = "patches"``) takes ``patterns`` and ``dla`` (read at
its class token); the commands built on token sequences refuse it in one line.
Errors: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

import tfmjax.interp.analyses as analyses
import tfmjax.interp.plots as plots
from tfmjax.checkpoint import CheckpointError, data_origin, workdir_of
from tfmjax.config import ConfigError
from tfmjax.data.vocab import RESERVED_TOKENS
from tfmjax.interp.heads import SCORES
from tfmjax.interp.hooked import run_with_cache
from tfmjax.interp.sae import SAEConfig
from tfmjax.interp.summary import summary_lines

COMMANDS = ("heads", "patterns", "dla", "patch", "ablate", "sae", "phase")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tfmjax.interp", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("workdir", help="a training run's workdir (or one step dir)")
    p.add_argument("command", choices=COMMANDS)
    p.add_argument("--out", help="output folder (default WORKDIR/interp)")
    given = p.add_mutually_exclusive_group()
    given.add_argument(
        "--input", help="an imported model: the text to analyse (its own tokenizer reads it)"
    )
    given.add_argument("--ids", help='an imported model: token ids to analyse, e.g. "464 3290"')
    p.add_argument("--batch-size", type=int, default=64, help="eval rows to analyse")
    p.add_argument("--length", type=int, default=10, help="heads/phase: repeated length")
    p.add_argument("--example", type=int, default=0, help="patterns: which eval row")
    p.add_argument("--alignment", choices=("mirror", "same"), help="patterns: cross-attention")
    p.add_argument(
        "--hooks",
        default="hook_resid_pre,hook_attn_out,hook_mlp_out",
        help="patch: comma-separated hook names per layer (STACK:NAME for the encoder)",
    )
    p.add_argument(
        "--threshold", type=float, default=0.3, help="ablate: head score that marks a circuit"
    )
    p.add_argument(
        "--per", choices=("layer", "position"), default="position", help="patch: the grid"
    )
    p.add_argument("--layer", type=int, default=0, help="sae: which layer's hook_resid_post")
    p.add_argument("--features", type=int, default=256, help="sae: dictionary size")
    p.add_argument(
        "--l1", type=float, default=1.0, help="sae: L1 coefficient (raise it for a sparser code)"
    )
    p.add_argument("--steps", type=int, default=2000, help="sae: training steps")
    p.add_argument("--batches", type=int, default=16, help="sae: training batches to collect")
    data_origin.add_argument(p)
    return p


def write_report(out: Path, section: str, data: dict) -> Path:
    """Merge ``{section: data}`` into ``out/interp.json``."""
    path = out / "interp.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    report[section] = data
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    return path


def token_labels(run, ids) -> list[str]:
    """Readable labels of token ids (reserved names, task symbols, ``?id`` past the task; an
    imported model's own tokens)."""
    label = getattr(run.source, "label", None)
    if label is not None:
        return [label(i) for i in np.asarray(ids).tolist()]
    vocab = getattr(run.source, "task", None)
    vocab = getattr(vocab, "vocab", None)
    labels = []
    for i in np.asarray(ids).tolist():
        if i < len(RESERVED_TOKENS):
            labels.append(RESERVED_TOKENS[i].strip("<>"))
        elif vocab is not None and i < vocab.size:
            labels.append(vocab.decode([i]))
        else:
            labels.append(f"?{i}")
    return labels


def run_command(args) -> dict:
    """Run one command; returns its report section (PNGs written on the way)."""
    if args.command == "phase":
        accept = args.accept_changed_data
        report = analyses.phase_report(args.workdir, length=args.length, accept_changed_data=accept)
        out = _out(args)
        plots.curves(
            report["steps"],
            {name.replace("_", "-"): report[name] for name in SCORES},
            out / "phase.png",
            title="best decoder head score of each kind, per checkpoint",
            ylabel="score",
        )
        return report
    run = analyses.load_run(
        args.workdir,
        args.command,
        args.input,
        args.ids,
        accept_changed_data=args.accept_changed_data,
    )
    batch = run.batch(args.batch_size)
    out = _out(args)
    if args.command == "heads":
        report = analyses.heads_report(run, length=args.length)
        for stack, scores in report.items():
            grids = {k: np.asarray(v) for k, v in scores.items() if k != "top"}
            plots.head_scores(grids, out / f"heads_{stack}.png", title=f"{stack} head scores")
        return report
    if args.command == "patterns":
        return _patterns(run, batch, args, out)
    if args.command == "dla":
        report = analyses.dla_report(run, batch)
        plots.logit_attribution(
            report["names"],
            report["values"],
            out / "dla.png",
            title="direct logit attribution to the answer tokens",
            top_k=16,
        )
        return report
    if args.command == "patch":
        hooks = [h.strip() for h in args.hooks.split(",") if h.strip()]
        report = analyses.patch_report(run, batch, hooks, per=args.per)
        for name, grid in report["grids"].items():
            plots.patching_heatmap(
                np.asarray(grid).reshape(len(grid), -1),
                out / f"patch_{name.replace(':', '_')}.png",
                title=f"{name}: share of the answer log-prob restored",
                xlabel="position" if args.per == "position" else "",
                ylabel="layer",
            )
        return report
    if args.command == "ablate":
        report = analyses.circuit_report(run, batch, threshold=args.threshold, length=args.length)
        for name, grid in report["single_head_ablations"].items():
            if isinstance(grid, list):
                plots.patching_heatmap(
                    np.asarray(grid),
                    out / f"ablate_{name.replace('.', '_')}.png",
                    title=f"{name}: exact-match with one head mean-ablated "
                    f"(baseline {report['single_head_ablations']['baseline']:.3f})",
                    xlabel="head",
                    ylabel="layer",
                )
        return report
    config = SAEConfig(num_features=args.features, l1_coeff=args.l1, steps=args.steps)
    return analyses.sae_report(run, args.layer, config, batches=args.batches)


def _out(args) -> Path:
    return Path(args.out) if args.out else workdir_of(args.workdir) / "interp"


def _patterns(run, batch, args, out: Path) -> dict:
    rows = len(next(iter(batch.values())))
    if not 0 <= args.example < rows:
        raise ValueError(f"--example {args.example} is not one of the {rows} rows analysed")
    row = {k: v[args.example : args.example + 1] for k, v in batch.items()}
    _, cache = run_with_cache(run.model, run.params, row, names=["*.hook_pattern"])
    sides = _side_labels(run, row)
    report = {"files": []}
    for name in cache.names():
        stack = name.split(".")[0]
        keys = sides["encoder"] if ".cross_attn." in name else sides[stack]
        queries = sides[stack]
        pattern = np.asarray(cache[name][0])[:, : len(queries), : len(keys)]  # [N,T,S]
        path = out / f"{name.replace('.hook_pattern', '').replace('.', '_')}.png"
        plots.attention_patterns(pattern, path, queries, keys, title=name)
        report["files"].append(path.name)
    if args.alignment:
        report["alignment"] = analyses.alignment_share(run, batch, args.alignment)
    return report


def _side_labels(run, row: dict) -> dict:
    """Token labels of one row's positions on each side, padding cut: the encoder reads its
    inputs; a decoder reads BOS and then its tokens (shifted right). A model whose slots are
    not tokens names them itself (an image model: ``cls``, ``patch 0 (r0,c0)``, ...)."""
    named = run.model.position_labels()
    if named is not None:
        return {run.model.head_stack: named}
    out, real = {}, run.model.token_mask  # False on the model's pad id
    if "inputs" in row:
        ids = np.asarray(row["inputs"][0])
        out["encoder"] = token_labels(run, ids[real(ids)])
        targets = np.asarray(row["targets"][0])
    else:
        targets = np.asarray(row["tokens"][0])
        out["encoder"] = token_labels(run, targets[real(targets)])  # encoder-only
    out["decoder"] = token_labels(run, [run.model.config.bos_id, *targets[real(targets)][:-1]])
    return out


def _files(folder: Path) -> set[tuple[str, int]]:
    """``(name, modification time)`` of each file in ``folder`` (none when it is missing)."""
    if not folder.is_dir():
        return set()
    return {(p.name, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()}


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    before = _files(_out(args))
    try:
        report = run_command(args)
    except (CheckpointError, ConfigError, ValueError, KeyError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return 2
    path = write_report(_out(args), args.command, report)
    written = sorted(name for name, _ in _files(path.parent) - before)
    print(f"{args.command}: wrote {', '.join(written)} in {path.parent}/")
    for line in summary_lines(args.command, report):
        print(f"  {line}")
    return 0
