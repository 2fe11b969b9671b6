"""Every source of text is a :class:`~tfmjax.data.tokenizers.Tokenizer`: a toy task's
vocabulary, a corpus's char and BPE tokenizers, an imported model's Hugging Face tokenizer
(read from the files ``hf import`` reads). Each round-trips real text and names the special
ids its source has (the HF ones as transformers names them: ``goldens/tokenizers.json``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tfmjax.data import make_task
from tfmjax.data.tokenizers import MIN_BPE_VOCAB, Tokenizer, tokenizer_from_dict, train_tokenizer
from tfmjax.data.vocab import BOS_ID, EOS_ID, PAD_ID

HF = Path(__file__).parents[1] / "hf"
TEXT = "ROMEO: But soft, what light through yonder window breaks?\nIt is the east."


def _fixture():
    """tests/hf/tokenizer_fixture.py (tests/ is no package): HF tokenizers as imported."""
    spec = importlib.util.spec_from_file_location("tokenizer_fixture", HF / "tokenizer_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_task_vocabulary_is_a_tokenizer():
    vocab = make_task("reverse", max_len=5, num_symbols=6).vocab
    assert isinstance(vocab, Tokenizer)
    ids = vocab.encode("c a f b")
    assert vocab.decode(ids) == "c a f b" and min(ids) >= 5  # task symbols after the reserved
    assert (vocab.bos_id, vocab.eos_id, vocab.pad_id, vocab.size) == (BOS_ID, EOS_ID, PAD_ID, 11)
    assert vocab.decode([vocab.bos_id, *ids, vocab.eos_id, *ids]) == "c a f b"


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_a_corpus_tokenizer_is_a_tokenizer_and_survives_its_checkpoint(kind):
    tok = train_tokenizer(kind, [TEXT * 3], vocab_size=MIN_BPE_VOCAB + 20)
    for t in (tok, tokenizer_from_dict(json.loads(json.dumps(tok.to_dict())))):
        assert isinstance(t, Tokenizer)
        ids = t.encode(TEXT)
        assert t.decode(ids) == TEXT and min(ids) >= 5  # no reserved id inside text
        assert (t.bos_id, t.eos_id, t.pad_id) == (BOS_ID, EOS_ID, PAD_ID)
        assert t.size == (len(set(TEXT)) + 5 if kind == "char" else MIN_BPE_VOCAB + 20)
        assert t.decode([t.bos_id, *ids, t.pad_id]) == TEXT  # BOS and PAD show as nothing


@pytest.mark.parametrize("case", ["gpt2", "llama", "t5"])
def test_an_imported_hf_tokenizer_is_a_tokenizer_with_its_own_special_ids(case, tmp_path):
    from tfmjax.hf.tokenizer import read

    fixture = _fixture()
    tok = read(fixture.model_dir(case, tmp_path))
    golden = json.loads((HF / "goldens" / "tokenizers.json").read_text())[case]
    assert isinstance(tok, Tokenizer) and tok.size == 96
    assert [tok.bos_id, tok.eos_id, tok.pad_id] == golden["special"]  # transformers' own
    assert tok.encode("the dog sat on") == golden["input_ids"]  # its BOS / EOS added
    assert tok.decode(tok.encode(fixture.TEXT)) == fixture.TEXT  # the added ones left out
    zero = tok.decode([0])  # GPT-2's id 0 is a byte; Llama's <unk> and T5's <pad> are special
    assert (zero != "") == (case == "gpt2")
    if case == "gpt2":
        assert tok.pad_id is None and tok.encode(zero) == [0]
