"""The text corpus, its tokenizers and its windows (tfmjax.data.corpus, tokenizers, text)."""

import numpy as np
import pytest

from tfmjax.data.corpus import clean_play, load_plays
from tfmjax.data.sources import open_source
from tfmjax.data.text import TextSource, mask_tokens, split_play
from tfmjax.data.tokenizers import (
    CharTokenizer,
    char_lengths,
    tokenizer_from_dict,
    train_tokenizer,
)
from tfmjax.data.vocab import EOS_ID, MASK_ID, RESERVED_TOKENS

BREAK = "  "  # Markdown's hard line break: two trailing spaces
MARKDOWN = "\n".join(
    [
        "# A Play",
        "",
        "## ACT I",
        "",
        "### SCENE I. A room.",
        "",
        "_Enter ROMEO and JULIET, with",
        "Attendants_",
        "",
        "**ROMEO**" + BREAK,
        "But soft, what light \\-- through yonder window breaks?" + BREAK,
        "*[He draws his sword.]*",
        "It is the east\u2014and Juliet is the sun.",
        "",
        "**JULIET**" + BREAK,
        "_\\[Aside]_ Ay me!",
        "",
        "*Exeunt*",
        "",
    ]
)


def test_cleaning_rules_on_a_sample():
    """Headings and stage directions go, speakers become ``NAME:``, escapes and the em
    dash become ASCII, one blank line between speeches."""
    assert clean_play(MARKDOWN) == (
        "ROMEO:\n"
        "But soft, what light -- through yonder window breaks?\n"
        "It is the east--and Juliet is the sun.\n"
        "\n"
        "JULIET:\n"
        "Ay me!\n"
    )


@pytest.fixture(scope="module")
def plays():
    return load_plays()


def test_corpus_is_found_and_cleaned(plays):
    """38 plays from the installed package, about 4.8 M characters of plain ASCII with no
    Markdown left, laid out as speaker lines and speeches."""
    assert len(plays) == 38
    assert len({name for name, _ in plays}) == 38
    text = "".join(t for _, t in plays)
    assert 4_500_000 < len(text) < 5_100_000
    assert text.isascii()
    for mark in ("**", "#", "\\", "[", "]", "_"):
        assert mark not in text, mark
    hamlet = dict(plays)["hamlet"]
    assert "HAMLET:\nTo be, or not to be: that is the question:\n" in hamlet


def test_split_is_contiguous_and_disjoint(plays):
    """Each play's first ~90% trains and the rest validates, cut between lines."""
    for _, text in plays:
        train, valid = split_play(text)
        assert train + valid == text
        assert train.endswith("\n") and 0.88 < len(train) / len(text) <= 0.9


@pytest.fixture(scope="module")
def char_source():
    return TextSource("shakespeare", {"tokenizer": "char", "context": 32})


def test_token_files_hold_each_split_with_eos_between_plays(char_source, plays):
    tok = char_source.tokenizer
    for index, split in enumerate(("train", "eval")):
        ids = char_source.ids[split]
        expected = [i for _, t in plays for i in tok.encode(split_play(t)[index]) + [EOS_ID]]
        np.testing.assert_array_equal(ids, expected)
    assert char_source.num_chars["train"] + char_source.num_chars["eval"] == sum(
        len(t) for _, t in plays
    )


def test_windows_are_a_pure_function_of_seed_step_split(char_source):
    a = char_source.windows(batch_size=8, seed=3, step=5, split="train")
    b = char_source.windows(batch_size=8, seed=3, step=5, split="train")
    np.testing.assert_array_equal(a, b)
    assert a.shape == (8, 32) and a.dtype == np.int32
    assert not np.array_equal(a, char_source.windows(batch_size=8, seed=3, step=6, split="train"))
    assert not np.array_equal(a, char_source.windows(batch_size=8, seed=4, step=5, split="train"))


def _is_slice_of(window, ids) -> bool:
    hits = np.flatnonzero(ids[: len(ids) - len(window) + 1] == window[0])
    return any(np.array_equal(ids[h : h + len(window)], window) for h in hits)


def test_eval_windows_come_from_the_validation_text(char_source):
    windows = char_source.windows(batch_size=4, seed=0, step=0, split="eval")
    for w in windows:
        assert _is_slice_of(w, char_source.ids["eval"])


def test_lm_batch_layout(char_source):
    batch = char_source.batch(batch_format="prompt_answer", batch_size=4, seed=0, step=0)
    assert batch["tokens"].shape == (4, 32)
    assert np.all(batch["loss_mask"] == 1.0) and np.all(batch["prompt_len"] == 0)
    with pytest.raises(ValueError, match="length split exists for toy tasks only"):
        char_source.windows(batch_size=4, seed=0, step=0, split="length")
    with pytest.raises(ValueError, match="serves prompt_answer, masked_lm batches"):
        char_source.batch(batch_format="seq2seq", batch_size=4, seed=0, step=0)


def test_masking_follows_80_10_10():
    """On 400k positions: 15% picked (±0.5 points), of which 80% MASK, 10% random and 10%
    kept (±1 point each); random ids are never reserved; unpicked positions are intact."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, 85, size=(1000, 400)).astype(np.int32)
    out = mask_tokens(tokens, np.random.default_rng(1), 0.15, 85)
    picked = out["loss_mask"] > 0
    np.testing.assert_array_equal(out["targets"], tokens)
    assert abs(picked.mean() - 0.15) < 0.005
    np.testing.assert_array_equal(out["tokens"][~picked], tokens[~picked])
    masked = out["tokens"][picked] == MASK_ID
    same = out["tokens"][picked] == tokens[picked]
    changed = ~masked & ~same
    assert abs(masked.mean() - 0.8) < 0.01
    # a random replacement equals the original 1 time in 80: expect 10% + 10%/80 unchanged
    assert abs(same.mean() - (0.1 + 0.1 / 80)) < 0.01
    assert abs(changed.mean() - 0.1 * 79 / 80) < 0.01
    assert out["tokens"][picked][changed].min() >= len(RESERVED_TOKENS)


def test_masked_lm_batches_are_reproducible(char_source):
    a = char_source.batch(batch_format="masked_lm", batch_size=4, seed=1, step=2)
    b = char_source.batch(batch_format="masked_lm", batch_size=4, seed=1, step=2)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert set(a) == {"tokens", "targets", "loss_mask"}


def test_char_tokenizer_round_trips_and_names_an_unknown_character(plays):
    tok = train_tokenizer("char", [t for _, t in plays])
    text = dict(plays)["macbeth"][:5000]
    assert tok.decode(tok.encode(text)) == text
    assert tokenizer_from_dict(tok.to_dict()).encode(text) == tok.encode(text)
    with pytest.raises(ValueError, match="character '~' is not in the tokenizer"):
        tok.encode("a~b")
    assert tok.encode("") == []


def test_bpe_tokenizer_round_trips_is_deterministic_and_restores(plays):
    texts = [t for _, t in plays[:6]]
    tok = train_tokenizer("bpe", texts, 400)
    assert tok.size == 400
    assert train_tokenizer("bpe", texts, 400).to_dict() == tok.to_dict()
    text = dict(plays)["hamlet"][:5000] + "caf\u00e9 \U0001f600 ~"  # unseen bytes too
    ids = tok.encode(text)
    assert len(ids) < len(text) * 0.7  # merges shorten ASCII text
    assert min(ids) >= len(RESERVED_TOKENS)
    assert tok.decode(ids) == text
    again = tokenizer_from_dict(tok.to_dict())
    assert again.encode(text) == ids
    with pytest.raises(ValueError, match="at least 261 ids"):
        train_tokenizer("bpe", texts, 100)


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_char_lengths_count_the_characters_of_any_text(plays, kind):
    """Summing ``char_lengths`` over the ids of a text gives its length (bits per character
    divides by this)."""
    tok = train_tokenizer(kind, [t for _, t in plays[:4]], 300)
    text = plays[5][1][:3000]
    ids = tok.encode(text)
    assert int(char_lengths(tok)[ids].sum()) == len(text)
    assert char_lengths(tok)[EOS_ID] == 1 and char_lengths(tok)[MASK_ID] == 0


def test_decode_shows_specials_and_ids_past_the_tokenizer():
    tok = CharTokenizer(list("ab"))
    assert tok.decode([5, MASK_ID, 6, EOS_ID, 5]) == "a<mask>b\na"
    assert tok.decode([5, EOS_ID, 6], stop_at_eos=True) == "a"
    assert tok.decode([1, 5, 0, 40]) == "a\ufffd"


def test_text_params_are_checked():
    with pytest.raises(ValueError, match="unknown parameter 'contxt'"):
        open_source("shakespeare", {"contxt": 8})
    with pytest.raises(ValueError, match="tokenizer='words' is invalid"):
        open_source("shakespeare", {"tokenizer": "words"})
    with pytest.raises(ValueError, match="mask_rate=1.5 is invalid"):
        open_source("shakespeare", {"mask_rate": 1.5})
    with pytest.raises(ValueError, match="did you mean 'shakespeare'"):
        open_source("shakespear", {})


@pytest.mark.parametrize("batch_format", ["prompt_answer", "masked_lm"])
def test_rows_of_a_batch_equal_the_whole_batchs_rows(char_source, batch_format):
    """A process builds only its rows of a global batch; they are the whole batch's."""
    args = dict(batch_format=batch_format, batch_size=8, seed=3, step=5)
    whole = char_source.batch(**args)
    for rows in (slice(0, 4), slice(4, 8), slice(2, 6)):
        part = char_source.batch(**args, rows=rows)
        assert part.keys() == whole.keys()
        for key in whole:
            np.testing.assert_array_equal(part[key], whole[key][rows], err_msg=key)
