"""Tiny imported models with a tokenizer beside them, for tests/hf: a small byte-level BPE
(``tokenizers``) trained here for each of the tiny random GPT-2, Llama and T5 goldens, in
that architecture's special-token layout (GPT-2: ``<|endoftext|>`` last, BOS = EOS, no pad;
Llama: ``<unk> <s> </s>`` at 0 1 2, BOS added; T5: ``<pad>`` 0, ``</s>`` 2 appended), saved
by transformers' ``save_pretrained`` when it is installed, else as it would leave it
(``tokenizer.json``, ``tokenizer_config.json``).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

GOLDENS = Path(__file__).parent / "goldens"
TEXT = (
    "the cat sat on the mat. the dog ran to the cat, and the cat ran up a tree! "
    "a bird sang in the tree; the dog barked at it. then it began to rain, so they went home. "
    "she read a book by the fire while the kettle boiled, and the wind howled over the hills."
)
# case: golden model, special tokens (in id order, or appended last), tokenizer_config fields,
# post-processor template (None: none)
CASES = {
    "gpt2": dict(
        model="gpt2_hf_ids",
        first=[],
        last=["<|endoftext|>"],
        config={"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
        template=None,
    ),
    "llama": dict(
        model="llama_hf_ids",
        first=["<unk>", "<s>", "</s>"],
        last=[],
        config={"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        template="<s> $A",
    ),
    "t5": dict(
        model="t5_v1_0",
        first=["<pad>", "<unk>", "</s>"],
        last=[],
        config={"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"},
        template="$A </s>",
    ),
}


def train_tokenizer(case: str):
    """A byte-level BPE of 96 ids (the tiny models' vocabulary) in ``case``'s layout."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    spec = CASES[case]
    unk = "<unk>" if "<unk>" in spec["first"] else None
    tok = Tokenizer(models.BPE(unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    size = 96 - len(spec["last"])
    trainer = trainers.BpeTrainer(
        vocab_size=size, special_tokens=spec["first"], show_progress=False
    )
    tok.train_from_iterator([TEXT] * 4, trainer)
    tok.add_special_tokens(spec["last"])
    assert tok.get_vocab_size() == 96  # every id of the model is a token
    if spec["template"]:
        special = [t for t in spec["first"] if t in spec["template"]]
        tok.post_processor = processors.TemplateProcessing(
            single=spec["template"], special_tokens=[(t, tok.token_to_id(t)) for t in special]
        )
    return tok


def model_dir(case: str, root: Path, *, tokenizer: bool = True) -> Path:
    """The golden model of ``case`` with its tokenizer files beside it, as save_pretrained
    would leave them (tokenizer.json, tokenizer_config.json)."""
    spec = CASES[case]
    out = root / f"{case}_hf"
    out.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(GOLDENS / spec["model"] / name, out / name)
    if tokenizer and importlib.util.find_spec("transformers") is not None:
        from transformers import PreTrainedTokenizerFast  # its own save_pretrained, then

        fast = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(case), **spec["config"])
        fast.save_pretrained(str(out))
    elif tokenizer:
        train_tokenizer(case).save(str(out / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **spec["config"]}
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    return out
