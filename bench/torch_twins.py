"""PyTorch models of the same sizes as a tfmjax config, trained the same way, for
``bench/train.py``'s side-by-side tokens/s (``pip install 'tfmjax[bench]'``).

  gpt2         Hugging Face ``GPT2LMHeadModel`` for a decoder-only config (a bias in every
               linear layer; "gelu" is the exact-erf GELU in both libraries)
  transformer  ``torch.nn.Transformer`` for an encoder-decoder config: pre-LayerNorm
               (``norm_first``), the config's activation, dropout 0, batch first, sinusoidal
               positions added to unscaled embeddings, an untied output projection, no
               padding masks (random full-length batches); loss:
               cross-entropy of the targets, teacher-forced with BOS in front

Both train with ``torch.optim.AdamW`` on every parameter (the config's betas, eps, weight
decay, constant learning rate) and ``clip_grad_norm_`` at the config's clip norm.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings

# tfmjax activation -> GPT-2's activation_function: "gelu" is the exact (erf) GELU in both.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def available() -> bool:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def gpt2(cfg):
    """``(model, loss of a batch dict of LongTensors)`` for a decoder-only ``cfg``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    hf_cfg = GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.max_len,
        n_embd=cfg.d_model,
        n_layer=cfg.num_layers,
        n_head=cfg.num_heads,
        n_inner=cfg.d_ff,
        activation_function=HF_ACTIVATIONS[cfg.activation],
        layer_norm_epsilon=cfg.norm_eps,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=cfg.bos_id,  # GPT-2's own 50256 lies outside this vocabulary
        eos_token_id=2,
    )
    model = GPT2LMHeadModel(hf_cfg).train()
    model.loss_type = "ForCausalLM"  # the loss it falls back to anyway, without a warning
    return model, lambda b: model(input_ids=b["tokens"], labels=b["tokens"]).loss


def transformer(cfg):
    """``(model, loss of a batch dict of LongTensors)`` for an encoder-decoder ``cfg``."""
    import torch
    from torch import nn

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            D = cfg.d_model
            self.src_embed = nn.Embedding(cfg.vocab_size, D)
            self.tgt_embed = nn.Embedding(cfg.vocab_size, D)
            with warnings.catch_warnings():  # "nested tensors are off with norm_first": yes
                warnings.simplefilter("ignore", UserWarning)
                self.core = nn.Transformer(
                    d_model=D,
                    nhead=cfg.num_heads,
                    num_encoder_layers=cfg.num_layers,
                    num_decoder_layers=cfg.decoder_layers,
                    dim_feedforward=cfg.d_ff,
                    dropout=0.0,
                    activation=cfg.activation,
                    layer_norm_eps=cfg.norm_eps,
                    batch_first=True,
                    norm_first=cfg.norm_position == "pre",
                )
            self.head = nn.Linear(D, cfg.vocab_size)
            position = torch.arange(cfg.max_len, dtype=torch.float32)[:, None]
            rate = torch.exp(torch.arange(0, D, 2, dtype=torch.float32) * (-math.log(1e4) / D))
            table = torch.zeros(cfg.max_len, D)
            table[:, 0::2], table[:, 1::2] = torch.sin(position * rate), torch.cos(position * rate)
            self.register_buffer("positions", table)

        def forward(self, inputs, decoder_inputs):
            S, T = inputs.shape[1], decoder_inputs.shape[1]
            src = self.src_embed(inputs) + self.positions[:S]
            tgt = self.tgt_embed(decoder_inputs) + self.positions[:T]
            causal = nn.Transformer.generate_square_subsequent_mask(T)
            return self.head(self.core(src, tgt, tgt_mask=causal, tgt_is_causal=True))

    model = Seq2Seq().train()

    def loss(b):
        targets = b["targets"]
        bos = torch.full_like(targets[:, :1], cfg.bos_id)
        logits = model(b["inputs"], torch.cat([bos, targets[:, :-1]], 1))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return model, loss


TWINS = {"gpt2": gpt2, "transformer": transformer}
TWIN_NAMES = {"gpt2": "Hugging Face GPT2LMHeadModel", "transformer": "torch.nn.Transformer"}


def set_fastest_threads(run, warm: int, timed: int) -> int:
    """Set torch's thread count to the faster of 1 and its default on ``run(warm)`` then a
    timed ``run(timed)``, and return it. torch's OpenMP threads spin-wait: on a busy machine
    fewer threads can be much faster."""
    import torch

    trials = {}
    for threads in sorted({1, torch.get_num_threads()}):
        torch.set_num_threads(threads)
        run(warm)
        start = time.perf_counter()
        run(timed)
        trials[threads] = time.perf_counter() - start
    best = min(trials, key=trials.get)
    torch.set_num_threads(best)
    return best


def time_training(twin: str, cfg, optim, batch: dict, steps: int, repeats: int) -> dict:
    """Train ``TWINS[twin](cfg)`` on ``batch`` (numpy arrays, the shapes tfmjax trains on):
    per-step wall and process-CPU milliseconds (medians and best of ``repeats`` runs of
    ``steps`` steps), the parameter count and the thread count (``set_fastest_threads``)."""
    import torch
    import transformers

    torch.manual_seed(0)
    model, loss_of = TWINS[twin](cfg)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=optim.learning_rate,
        betas=(optim.b1, optim.b2),
        eps=optim.eps,
        weight_decay=optim.weight_decay,
    )
    tensors = {k: torch.from_numpy(v).long() for k, v in batch.items() if v.ndim == 2}

    def train_steps(n: int) -> None:
        for _ in range(n):
            loss = loss_of(tensors)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if optim.clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), optim.clip_norm)
            opt.step()
        assert torch.isfinite(loss), loss

    default_threads = torch.get_num_threads()
    best_threads = set_fastest_threads(train_steps, warm=3, timed=5)
    train_steps(3)
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        train_steps(steps)
        wall.append((time.perf_counter() - start) / steps)
        cpu.append((time.process_time() - start_cpu) / steps)
    return {
        "params": sum(p.numel() for p in model.parameters()),  # tied weights counted once
        "step_ms": statistics.median(wall) * 1e3,
        "best_step_ms": min(wall) * 1e3,
        "cpu_ms": statistics.median(cpu) * 1e3,
        "threads": best_threads,
        "default_threads": default_threads,
        "versions": f"torch {torch.__version__}, transformers {transformers.__version__}",
    }
