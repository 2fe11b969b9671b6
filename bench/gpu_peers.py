"""Our train step against PyTorch twins of the same GPT, interleaved in one process.

    python bench/gpu_peers.py                          # GPT-2 small, context 1024, batch 8
    python bench/gpu_peers.py --shape shakespeare_char # the small model, where the host counts
    python bench/gpu_peers.py --quick --rows tfmjax nanogpt   # tiny, any platform (plumbing)

Rows, each trained on the same ``[B, T]`` token batch with AdamW at the config's settings
(betas, eps, weight decay, clip 1.0), bf16 compute and float32 master weights and moments:

  tfmjax    the training loop's own jitted step (``build_run``: state donated, AdamW fused
            into a few buffers on one device), ``train.steps_per_call`` steps a call as the
            config resolves it on this backend (GPU: up to 16)
  nanogpt   the fastest public PyTorch recipe: a GPT written here as nanoGPT does (tied
            embeddings, ``scaled_dot_product_attention(is_causal=True)``, which takes the
            flash backend on a GPU), ``torch.autocast(bfloat16)``, ``AdamW(fused=True)`` on
            CUDA, ``torch.compile``
  hf        Hugging Face ``GPT2LMHeadModel`` with ``attn_implementation="sdpa"``, the same
            autocast and optimizer, not compiled

Each row compiles and warms up, then ``--rounds`` rounds time ``--steps`` steps of every row
in turn (a drifting device clock or a busy host shares out evenly); the median over rounds
is reported as tokens/s, MFU against :data:`device.PEAK_BF16` (model FLOPs of
bench/train.py's ``model_flops``), and the ratio of tfmjax to each twin. Writes
``bench/results/gpu_peers-<shape>-<device>.json``. torch comes with ``pip install
'tfmjax[bench]'`` (on a GPU host, its CUDA build).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from device import PEAK_BF16, QUICK_TRAIN, TRAIN_SHAPES, _flops_per_token, _slug  # noqa: E402

from tfmjax.config import load  # noqa: E402
from tfmjax.train.run import build_run  # noqa: E402
from tfmjax.train.state import create_state  # noqa: E402

ROWS = ("tfmjax", "nanogpt", "hf")


# -- tfmjax ------------------------------------------------------------------------------


def tfmjax_row(experiment):
    """``(run n steps -> None, tokens per step)`` for our step on ``experiment``."""
    run = build_run(experiment)
    k = experiment.train.steps_per_call_on(jax.default_backend())
    batch = run.device_batch(0)
    state = create_state(
        run.model, run.tx, run.batch(0), experiment.train.seed, run.state_shardings
    )
    stacked = jax.tree.map(lambda x: jnp.stack([x] * k), batch) if k > 1 else None
    box = {"state": state}

    def steps(n: int) -> None:
        state, metrics = box["state"], None
        for _ in range(max(1, n // k)):
            if stacked is None:
                state, metrics = run.train_step(state, batch)
            else:
                state, metrics = run.train_steps(state, stacked)
        jax.block_until_ready(metrics)
        box["state"] = state

    return steps, k


# -- PyTorch twins -----------------------------------------------------------------------


def nanogpt(cfg):
    """A GPT-2 of ``cfg``'s sizes as nanoGPT writes it: ``model(idx, targets) -> loss``."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    D, N, bias = cfg.d_model, cfg.num_heads, cfg.use_bias
    gelu = "tanh" if cfg.activation == "gelu_tanh" else "none"

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(D, eps=cfg.norm_eps, bias=bias)
            self.qkv = nn.Linear(D, 3 * D, bias=bias)
            self.proj = nn.Linear(D, D, bias=bias)
            self.ln_2 = nn.LayerNorm(D, eps=cfg.norm_eps, bias=bias)
            self.fc = nn.Linear(D, cfg.d_ff, bias=bias)
            self.fc_proj = nn.Linear(cfg.d_ff, D, bias=bias)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.ln_1(x)).split(D, dim=2)
            q, k, v = (a.view(B, T, N, D // N).transpose(1, 2) for a in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
            return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate=gelu))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(cfg.vocab_size, D)
            self.wpe = nn.Embedding(cfg.max_len, D)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg.num_layers))
            self.ln_f = nn.LayerNorm(D, eps=cfg.norm_eps, bias=bias)

        def forward(self, idx, targets):
            positions = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(positions)
            for block in self.blocks:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.T  # tied, as in GPT-2
            return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    return GPT()


def hf_gpt2(cfg):
    """Hugging Face ``GPT2LMHeadModel`` of ``cfg``'s sizes with SDPA attention."""
    from torch_twins import gpt2  # bench/torch_twins.py: the same config mapping

    model, _ = gpt2(cfg)
    model.config._attn_implementation = "sdpa"

    def loss(idx, targets):
        logits = model(input_ids=idx).logits
        import torch.nn.functional as F

        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    return model, loss


def torch_row(name: str, experiment, tokens: np.ndarray, compile_: bool):
    """``(run n steps -> None, 1)`` for twin ``name`` on ``tokens [B, T+1]``."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    cfg, o = experiment.model, experiment.optim
    if name == "nanogpt":
        model = nanogpt(cfg).to(device)
        loss_of = torch.compile(model) if compile_ else model
    else:
        model, loss_of = hf_gpt2(cfg)
        model.to(device)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=o.learning_rate,
        betas=(o.b1, o.b2),
        eps=o.eps,
        weight_decay=o.weight_decay,
        fused=device.type == "cuda",
    )
    ids = torch.from_numpy(tokens).long().to(device)
    idx, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    amp = torch.autocast(device.type, dtype=torch.bfloat16)

    def steps(n: int) -> None:
        for _ in range(n):
            with amp:
                loss = loss_of(idx, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_norm or 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        else:
            loss.item()

    return steps, 1


# -- the comparison ----------------------------------------------------------------------


def compare(experiment, rows, steps: int, rounds: int, compile_: bool = True) -> dict:
    """Tokens/s (median over rounds) and MFU of each row, timed in turn each round."""
    run = build_run(experiment)
    batch = run.batch(0)
    B, T = np.shape(batch["tokens"])
    tokens = np.asarray(batch["tokens"])
    tokens = np.concatenate([tokens, tokens[:, :1]], axis=1)  # T inputs and T targets
    fns = {}
    for name in rows:
        fns[name] = (
            tfmjax_row(experiment)
            if name == "tfmjax"
            else torch_row(name, experiment, tokens, compile_)
        )
    for fn, k in fns.values():
        fn(2 * k)  # compile and warm
    per_round = {name: [] for name in fns}
    for r in range(rounds):
        order = list(fns)[r % len(fns) :] + list(fns)[: r % len(fns)]
        for name in order:
            fn, k = fns[name]
            n = max(k, steps // k * k)
            start = time.perf_counter()
            fn(n)
            per_round[name].append(n * B * T / (time.perf_counter() - start))
    flops_per_token = _flops_per_token(experiment, batch)
    peak = PEAK_BF16.get(jax.devices()[0].device_kind)
    result = {"shape": [int(B), int(T)], "flops_per_token": flops_per_token, "rows": {}}
    for name, rates in per_round.items():
        rate = statistics.median(rates)
        result["rows"][name] = {
            "tokens_per_sec": rate,
            "mfu": peak and rate * flops_per_token / peak,
            "rounds": rates,
        }
    ours = result["rows"].get("tfmjax", {}).get("tokens_per_sec")
    for name, row in result["rows"].items():
        if ours and name != "tfmjax":
            row["tfmjax_ratio"] = ours / row["tokens_per_sec"]
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=["gpt2-small", "shakespeare_char"], default="gpt2-small")
    parser.add_argument("--rows", nargs="*", choices=ROWS, default=list(ROWS))
    parser.add_argument("--steps", type=int, default=32, help="steps per row per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a tiny model (any platform)")
    parser.add_argument("--no-compile", action="store_true", help="nanogpt without torch.compile")
    parser.add_argument("--set", nargs="*", default=[], help="more tfmjax config overrides")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    config, overrides = TRAIN_SHAPES[args.shape]
    overrides = [*overrides, "model.dtype=bfloat16", *(QUICK_TRAIN if args.quick else [])]
    experiment = load(ROOT / config, [*overrides, *args.set])
    result = compare(experiment, args.rows, args.steps, args.rounds, not args.no_compile)
    result.update(device=jax.devices()[0].device_kind, overrides=[*overrides, *args.set])
    for name, row in result["rows"].items():
        mfu = f", MFU {row['mfu']:.1%}" if row["mfu"] else ""
        ratio = f", tfmjax {row['tfmjax_ratio']:.2f}x" if "tfmjax_ratio" in row else ""
        print(f"{name:8s} {row['tokens_per_sec']:12,.0f} tokens/s{mfu}{ratio}")
    args.out.mkdir(parents=True, exist_ok=True)
    quick = "-quick" if args.quick else ""
    path = args.out / f"gpu_peers-{args.shape}-{_slug(result['device'])}{quick}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
