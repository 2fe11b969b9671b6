"""The analyses behind ``python -m tfmjax.interp``, on a trained run and its task's batches.

Each returns plain numbers (JSON-ready) and the arrays a plot needs; :mod:`tfmjax.interp.cli`
turns them into PNGs and a report.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import tfmjax.interp.patching as patching
from tfmjax.checkpoint import (
    hf_tokenizer_of,
    is_imported,
    load_assets,
    load_for_inference,
    open_checkpoint_source,
)
from tfmjax.config import Experiment, from_dict
from tfmjax.data.vocab import RESERVED_TOKENS
from tfmjax.interp.attribution import logit_attribution
from tfmjax.interp.heads import SCORES, head_scores, pattern_stacks
from tfmjax.interp.hooked import (
    ActivationCache,
    hook_shapes,
    mean_ablate,
    run_with_cache,
    run_with_patches,
)
from tfmjax.interp.imported import open_user_text
from tfmjax.interp.sae import SAEConfig, loss_recovered, reconstruct, sae_metrics, train_sae
from tfmjax.models import build

EVAL_SEED = 0
CONTENT = len(RESERVED_TOKENS)  # first task symbol id


@dataclasses.dataclass
class Run:
    """A checkpoint opened for analysis: its experiment, model, params and data source."""

    path: Path
    step: int
    experiment: Experiment
    model: object
    params: dict
    source: object

    @property
    def task_vocab(self) -> int:
        return self.source.vocab_size

    def batch(self, size: int | None = None, split: str = "eval", step: int = 0) -> dict:
        """A batch of the run's own task (the evaluation stream by default), as jnp arrays."""
        data = self.experiment.data
        raw = self.source.batch(
            batch_format=self.model.batch_format,
            batch_size=size or data.batch_size,
            seed=EVAL_SEED,
            step=step,
            split=split,
        )
        return {k: jnp.asarray(v) for k, v in raw.items()}


def load_run(
    path: str | Path, command: str = "heads", text=None, ids=None, *, accept_changed_data=False
) -> Run:
    """The newest good checkpoint under ``path`` (a workdir or one step dir), with its task's
    data (an own task or text file that changed since training is refused unless
    ``accept_changed_data``); an imported model, which has none, reads ``text`` (or ``ids``,
    a string of ids) for ``command`` (:mod:`tfmjax.interp.imported`)."""
    path = Path(path)
    config, params, step = load_for_inference(path)
    experiment = from_dict(config)
    model = build(experiment.model)
    assets = load_assets(path, step)
    if is_imported(experiment, assets):
        tokenizer = hf_tokenizer_of(experiment, assets)
        source = open_user_text(model, tokenizer, command, text, ids)
    elif text is not None or ids is not None:
        raise ValueError(
            f"--input and --ids are for imported models; this run analyses its task "
            f"{experiment.data.task!r}: leave them out"
        )
    else:
        data, accept = experiment.data, accept_changed_data
        source = open_checkpoint_source(path, step, data, accept_changed_data=accept)
    return Run(path, step, experiment, model, params, source)


def checkpoint_steps(workdir: str | Path) -> list[Path]:
    """Every finished step directory under ``workdir/checkpoints``, oldest first."""
    root = Path(workdir) / "checkpoints"
    steps = [p for p in root.iterdir() if p.name.isdigit()] if root.is_dir() else []
    return sorted(steps, key=lambda p: int(p.name))


@functools.lru_cache(maxsize=8)
def _jitted_apply(model):
    return jax.jit(model.apply)


def logits_of(run: Run, batch: dict):
    """``logits_of(run, batch)``, compiled."""
    return _jitted_apply(run.model)(run.params, batch)


def metric_of(run: Run, name: str):
    """``exact_match`` (teacher-forced, = greedy), ``loss`` or ``logprob`` of the answers."""
    if name == "exact_match":
        return patching.teacher_forced_exact_match(run.model)
    loss = patching.answer_loss(run.model)
    if name == "loss":
        return loss
    if name == "logprob":
        return lambda logits, batch: -loss(logits, batch)
    raise ValueError(f"metric={name!r} is not one of exact_match, loss, logprob")


def corrupt_prompts(run: Run, batch: dict, key) -> dict:
    """``batch`` with every task symbol of its prompts (encoder inputs, or a decoder-only
    row's tokens before ``prompt_len``) resampled; answers, reserved ids and lengths kept."""
    out = dict(batch)
    key_name = "inputs" if "inputs" in batch else "tokens"
    ids = batch[key_name]
    is_prompt = ids >= CONTENT
    if "prompt_len" in batch:
        is_prompt &= jnp.arange(ids.shape[1])[None, :] < batch["prompt_len"][:, None]
    fresh = jax.random.randint(key, ids.shape, CONTENT, run.task_vocab)
    out[key_name] = jnp.where(is_prompt, fresh, ids).astype(ids.dtype)
    return out


# -- analyses ----------------------------------------------------------------------------------


def refuse_patch_input(run: Run, what: str, needs: str) -> None:
    """One-line ValueError when ``run`` is a patch (image) model, which ``what`` cannot
    analyse because it ``needs`` token sequences (heads, ablate, phase, patch, sae)."""
    if run.model.config.input == "patches":
        raise ValueError(
            f"{what}: needs {needs}; a patch (image) model (model.input='patches') reads pixels, "
            "not tokens: use patterns or dla on it"
        )


def heads_report(run: Run, length: int = 10, batch: int = 32, seed: int = 0) -> dict:
    """Head scores ``{score: [L][N]}`` of every self-attention stack that forms patterns
    (a retention, selective-scan or Nyström stack forms none), and the top head of each
    score (as ``"stack L{l}H{n}"``)."""
    refuse_patch_input(run, "heads, phase", "repeated random token sequences")
    out = {}
    stacks = pattern_stacks(run.model, run.params) or list(run.model.layer_stacks())[:1]
    for stack in stacks:  # none: head_scores refuses the first stack in one line
        length_fit = min(length, run.model.config.max_len // 2)
        scores = head_scores(
            run.model,
            run.params,
            jax.random.PRNGKey(seed),
            batch=batch,
            length=length_fit,
            stack=stack,
            high=run.task_vocab,
        )
        out[stack] = {k: np.asarray(v).round(4).tolist() for k, v in scores.items()}
        out[stack]["top"] = {k: _top_head(v) for k, v in scores.items()}
    return out


def _top_head(scores) -> dict:
    l, n = np.unravel_index(int(np.argmax(scores)), np.shape(scores))
    return {"layer": int(l), "head": int(n), "score": round(float(np.max(scores)), 4)}


def head_means(run: Run, batch: dict, kind: str = "attn") -> ActivationCache:
    """Each layer's ``{kind}.hook_z`` averaged over the batch and positions (mean ablation
    values), broadcast to the activation's shape."""
    names = [f"{s}.blocks.*.{kind}.hook_z" for s in run.model.layer_stacks()]
    names = [n for n in names if _has(run, batch, n)]
    _, cache = run_with_cache(run.model, run.params, batch, names=names)
    return ActivationCache(
        {
            n: jnp.broadcast_to(jnp.mean(z, axis=(0, 1), keepdims=True), z.shape)
            for n, z in cache.activations.items()
        }
    )


def _has(run: Run, batch, pattern: str) -> bool:
    return any(fnmatch.fnmatchcase(n, pattern) for n in hook_shapes(run.model, run.params, batch))


def ablation_report(run: Run, batch: dict, metric: str = "exact_match") -> dict:
    """Mean-ablate each head alone (self- and cross-attention): ``{stack/kind: [L][N]}`` of
    the metric, with the unablated baseline."""
    fn = metric_of(run, metric)
    means = head_means(run, batch, "attn")
    out = {"metric": metric, "baseline": float(fn(logits_of(run, batch), batch))}
    kinds = [("attn", means)]
    if "encoder" in run.model.layer_stacks() and "decoder" in run.model.layer_stacks():
        kinds.append(("cross_attn", head_means(run, batch, "cross_attn")))
    for kind, source in kinds:
        for stack in run.model.layer_stacks():
            if kind == "cross_attn" and stack != "decoder":
                continue
            sweep = patching.PatchSweep(run.model, f"{kind}.hook_z", fn, per="head", stack=stack)
            grid = sweep(run.params, batch, source)
            out[f"{stack}.{kind}"] = np.asarray(grid).round(4).tolist()
    return out


def ablate_heads(run: Run, batch: dict, heads, metric: str = "exact_match") -> float:
    """The metric with every head in ``heads`` (``(stack, layer, head)``, self-attention)
    mean-ablated at once."""
    means = head_means(run, batch, "attn")
    chosen: dict[str, list[int]] = {}
    for stack, layer, head in heads:
        chosen.setdefault(f"{stack}.blocks.{layer}.attn.hook_z", []).append(head)
    edits = {n: mean_ablate(means[n], n, heads=h) for n, h in chosen.items()}
    logits, _ = run_with_patches(run.model, run.params, batch, edits)
    return float(metric_of(run, metric)(logits, batch))


def circuit_report(run: Run, batch: dict, threshold: float = 0.3, length: int = 10) -> dict:
    """Heads whose score passes ``threshold`` (self-attention of every stack), and the
    metric with all of them mean-ablated at once, next to the single-head ablations."""
    refuse_patch_input(run, "ablate", "head scores on repeated token sequences")
    scores = heads_report(run, length=length)
    found = {}
    for stack, by_score in scores.items():
        for name in SCORES:
            grid = np.asarray(by_score[name])
            found[f"{stack}.{name}"] = [
                [stack, int(l), int(n)] for l, n in zip(*np.nonzero(grid >= threshold), strict=True)
            ]
    heads = sorted({tuple(h) for group in found.values() for h in group})
    return {
        "threshold": threshold,
        "heads_by_score": found,
        "ablated_together": [list(h) for h in heads],
        "exact_match_ablated_together": ablate_heads(run, batch, heads) if heads else None,
        "single_head_ablations": ablation_report(run, batch),
        "chance": round(1.0 / max(run.task_vocab - CONTENT, 1), 4),
    }


def dla_report(run: Run, batch: dict, top_k: int = 12) -> dict:
    """Direct logit attribution to the answer tokens: each residual part's contribution to
    the logit of the correct token, averaged over answer positions (``[C]``)."""
    _, cache = run_with_cache(run.model, run.params, batch)
    targets, mask = run.model.targets_and_mask(batch)
    names, parts = logit_attribution(run.model, run.params, cache, tokens=targets)
    weight = mask / jnp.sum(mask)
    values = np.asarray(jnp.sum(parts * weight[None], axis=(1, 2)))
    logits = logits_of(run, batch)
    own = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    total = float(jnp.sum(own * weight))
    order = np.argsort(-np.abs(values))[:top_k]
    return {
        "names": names,
        "values": values.round(4).tolist(),
        "sum": round(float(values.sum()), 4),
        "answer_logit": round(total, 4),
        "top": [[names[i], round(float(values[i]), 4)] for i in order],
    }


def alignment_share(run: Run, batch: dict, rule: str = "mirror") -> dict:
    """Cross-attention mass on the source position the task aligns each answer token with,
    per decoder layer and head: ``[L][N]``. ``mirror``: answer token ``t`` of a source of
    ``n`` symbols sits at source ``n-1-t`` (reverse); ``same``: at ``t`` (copy)."""
    if "inputs" not in batch:
        raise ValueError("alignment needs an encoder-decoder run (its cross-attention)")
    names = ["decoder.blocks.*.cross_attn.hook_pattern"]
    _, cache = run_with_cache(run.model, run.params, batch, names=names)
    patterns = cache.stack("cross_attn.hook_pattern")  # [L,B,N,T,S]
    n = jnp.sum(batch["inputs"] >= CONTENT, axis=1)  # [B] source symbols
    T = patterns.shape[3]
    t = jnp.arange(T)[None, :]
    aligned = (n[:, None] - 1 - t) if rule == "mirror" else jnp.broadcast_to(t, (n.shape[0], T))
    valid = t < n[:, None]  # answer symbols only (not EOS)
    index = jnp.clip(aligned, 0, patterns.shape[4] - 1)  # [B,T]
    picked = jnp.take_along_axis(patterns, index[None, :, None, :, None], axis=4)[..., 0]
    share = jnp.sum(picked * valid[None, :, None, :], axis=(1, 3)) / jnp.sum(valid)
    return {"rule": rule, "share": np.asarray(share).round(4).tolist()}


def patch_report(run: Run, batch: dict, hooks, per: str = "position", seed: int = 1) -> dict:
    """Activation patching from the clean run into a run with resampled prompts, per hook and
    layer: the answers' log-prob, as the share of the clean-minus-corrupt gap restored."""
    refuse_patch_input(run, "patch", "prompt tokens to resample")
    metric = metric_of(run, "logprob")
    corrupt = corrupt_prompts(run, batch, jax.random.PRNGKey(seed))
    clean_logits, clean = run_with_cache(run.model, run.params, batch)
    clean_value = float(metric(clean_logits, batch))
    corrupt_value = float(metric(logits_of(run, corrupt), corrupt))
    gap = clean_value - corrupt_value
    out = {"clean": round(clean_value, 4), "corrupt": round(corrupt_value, 4), "grids": {}}
    for hook in hooks:
        stack, _, name = hook.partition(":") if ":" in hook else ("decoder", "", hook)
        sweep = patching.PatchSweep(run.model, name, metric, per=per, stack=stack)
        grid = (np.asarray(sweep(run.params, corrupt, clean)) - corrupt_value) / gap
        out["grids"][f"{stack}:{name}"] = grid.round(4).tolist()
    return out


def sae_report(run: Run, layer: int, config: SAEConfig, batches: int = 16, stack="decoder"):
    """Train a sparse autoencoder on ``{stack}.blocks.{layer}.hook_resid_post`` over
    ``batches`` training batches (non-padding positions), then splice its reconstruction
    into the model on eval batches: reconstruction metrics and the answers' loss clean,
    spliced and zero-ablated."""
    refuse_patch_input(run, "sae", "a decoder's residual stream at token positions")
    name = f"{stack}.blocks.{layer}.hook_resid_post"
    rows = []
    for step in range(batches):
        batch = run.batch(split="train", step=step)
        _, cache = run_with_cache(run.model, run.params, batch, names=[name])
        keep = np.asarray(_positions(run, batch)).reshape(-1)
        rows.append(np.asarray(cache[name]).reshape(-1, cache[name].shape[-1])[keep])
    acts = np.concatenate(rows)
    sae, history = train_sae(acts, config)
    batch = run.batch()
    _, cache = run_with_cache(run.model, run.params, batch, names=[name])
    keep = np.asarray(_positions(run, batch)).reshape(-1)
    held_out = np.asarray(cache[name]).reshape(-1, cache[name].shape[-1])[keep]
    loss = metric_of(run, "loss")
    splice = lambda x: reconstruct(sae, x.reshape(-1, x.shape[-1])).reshape(x.shape)
    losses = {
        "clean": float(loss(logits_of(run, batch), batch)),
        "spliced": float(
            loss(run_with_patches(run.model, run.params, batch, {name: splice})[0], batch)
        ),
        "zero_ablated": float(
            loss(run_with_patches(run.model, run.params, batch, {name: jnp.zeros_like})[0], batch)
        ),
    }
    return {
        "hook": name,
        "training_rows": int(acts.shape[0]),
        "config": dataclasses.asdict(config),
        "final_training_loss": float(np.asarray(history["loss"])[-1]),
        "metrics": sae_metrics(sae, held_out),
        "answer_loss": {k: round(v, 4) for k, v in losses.items()},
        "loss_recovered": round(
            loss_recovered(losses["clean"], losses["spliced"], losses["zero_ablated"]), 4
        ),
    }


def _positions(run: Run, batch: dict):
    """``[B,T]`` True at the decoder positions that hold a real input (not padding)."""
    ids = batch["targets"] if "targets" in batch and "inputs" in batch else batch["tokens"]
    n = np.sum(run.model.token_mask(ids), axis=1)  # tokens that are not the model's pad id
    return jnp.arange(ids.shape[1])[None, :] <= jnp.asarray(n)[:, None] - 1


def phase_report(
    workdir: str | Path, length: int = 10, batch: int = 32, *, accept_changed_data=False
) -> dict:
    """The best decoder head score of each kind at every checkpoint kept, and where each
    curve jumps most between two checkpoints (the phase change)."""
    steps, curves = [], {name: [] for name in SCORES}
    for step_dir in checkpoint_steps(workdir):
        run = load_run(step_dir, accept_changed_data=accept_changed_data)
        scores = heads_report(run, length=length, batch=batch)["decoder"]
        steps.append(run.step)
        for name in SCORES:
            curves[name].append(round(float(np.max(scores[name])), 4))
    if not steps:
        raise ValueError(f"no checkpoints under {workdir}/checkpoints")
    jumps = {}
    for name, values in curves.items():
        at = int(np.argmax(np.diff(values))) + 1 if len(values) > 1 else 0
        jumps[name] = {"step": steps[at], "from": values[max(at - 1, 0)], "to": values[at]}
    return {"steps": steps, **curves, "largest_jump": jumps}
