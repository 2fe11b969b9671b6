"""generate_texts on a toy task and ``python -m tfmjax.generate WORKDIR --input ...``."""

import numpy as np
import pytest

from tfmjax.config import DataConfig, Experiment
from tfmjax.data import make_task
from tfmjax.data.vocab import SEP_ID
from tfmjax.decode import BeamSearch, Greedy, Temperature, TopK, TopP, generate
from tfmjax.decode.options import strategy_from_args
from tfmjax.generate import generate_texts, main, parse_args

TASK_PARAMS = {"max_len": 5, "num_symbols": 6}


@pytest.fixture(scope="module")
def setup(tiny):
    task = make_task("reverse", **TASK_PARAMS)
    model, params = tiny("tiny-gpt2", vocab_size=task.vocab.size, seed=1)
    return task, model, params


def answers(setup, texts, strategy, n):
    task, model, params = setup
    return generate_texts(model.config, params, task.vocab, texts, strategy, n, task=task)


def test_generate_texts_of_a_task_is_generate_on_source_sep(setup):
    task, model, params = setup
    text = "c a f"
    (out,) = answers(setup, [text], Greedy(), 6)
    ids = generate(model, params, [task.vocab.encode(text) + [SEP_ID]], Greedy(), 6).tokens
    assert out == task.vocab.decode(np.asarray(ids)[0])
    assert isinstance(out, str) and set(out.split()) <= set(task.vocab.symbols)
    many = answers(setup, [text, "b"], BeamSearch(2), 6)
    assert isinstance(many, list) and len(many) == 2
    with pytest.raises(ValueError, match="unknown symbol 'z'"):
        answers(setup, ["a z"], Greedy(), 6)


def save_workdir(path, model, params, data: DataConfig):
    """Write one checkpoint of ``params`` with its experiment config into ``path``."""
    from tfmjax.checkpoint import Checkpointer

    exp = Experiment(name="cli", model=model.config, data=data)
    ckpt = Checkpointer(path)
    ckpt.save(1, {"params": params}, config=exp.to_dict())
    ckpt.close() if hasattr(ckpt, "close") else ckpt.wait()
    return path


@pytest.fixture(scope="module")
def workdir(setup, tmp_path_factory):
    """A workdir holding one checkpoint of the tiny model, with its experiment config."""
    task, model, params = setup
    data = DataConfig(task="reverse", task_params=dict(TASK_PARAMS))
    return save_workdir(tmp_path_factory.mktemp("generate_cli"), model, params, data)


def test_cli_loads_checkpoint_and_prints_answers(setup, workdir, capsys):
    """``python -m tfmjax.generate WORKDIR --input ...`` prints one greedy answer per input,
    the ones generate_texts gives; an unknown symbol is refused in one line."""
    task, _, _ = setup
    assert main([str(workdir), "--input", "c a f", "--input", "b"]) == 0
    lines = [line.rstrip() for line in capsys.readouterr().out.strip().splitlines()]
    want = answers(setup, ["c a f", "b"], Greedy(), task.max_target_len("eval") + 1)
    assert lines == [f"c a f -> {want[0]}".rstrip(), f"b -> {want[1]}".rstrip()]

    assert main([str(workdir), "--input", "a z"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown symbol 'z'") and "\n" not in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--input", " "], "error: --input is empty"),
        (["--input", "c <eos> a"], "error: --input 'c <eos> a' holds the special token <eos>"),
        (["--input", "c a", "--max-new-tokens", "0"], "error: --max-new-tokens=0 must be >= 1"),
        (["--input", "c a", "--beam-size", "3"], "error: --beam-size applies to --decode beam"),
        (
            ["--input", "c a", "--decode", "beam", "--top-p", "0.5"],
            "error: --top-p applies to --decode sample",
        ),
    ],
)
def test_cli_refuses_bad_requests_in_one_line(workdir, capsys, args, message):
    """README: empty inputs, special tokens, --max-new-tokens 0 and another --decode mode's
    options are refused in one line (exit 2), and nothing is printed on stdout."""
    assert main([str(workdir), *args]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith(message) and "\n" not in err
    assert captured.out == ""


def test_cli_warns_about_inputs_longer_than_trained(workdir, capsys):
    """An input longer than any training source gets a one-line warning and still an answer."""
    assert main([str(workdir), "--input", "a b c d e f", "--input", "c a"]) == 0
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        "warning: --input 'a b c d e f' has 6 symbols but the model was trained on at most 5 "
        "(task reverse); its answer is unlikely to be right"
    ]
    assert [line.split(" -> ")[0] for line in captured.out.splitlines()] == ["a b c d e f", "c a"]


def test_cli_strategies():
    def strategy(*flags):
        return strategy_from_args(parse_args(["wd", "--input", "a", *flags]))

    assert strategy() == Greedy()
    assert strategy("--decode", "sample") == Temperature(1.0)
    assert strategy("--decode", "sample", "--top-k", "2", "--temperature", "0.5") == TopK(2, 0.5)
    assert strategy("--decode", "sample", "--top-p", "0.8") == TopP(0.8)
    assert strategy("--decode", "sample", "--temperature", "2") == Temperature(2.0)
    assert strategy("--decode", "beam", "--beam-size", "3", "--alpha", "0") == BeamSearch(3, 0.0)
    with pytest.raises(ValueError, match="cannot be combined"):
        strategy("--decode", "sample", "--top-k", "2", "--top-p", "0.5")
    with pytest.raises(ValueError, match="TopK"):
        strategy("--decode", "sample", "--top-k", "0")


def test_cli_writes_inputs_as_the_task_does(tiny, tmp_path, capsys):
    """A model trained on zero-padded addition answers "4 5 + 1 2 3" as it would answer the
    padded "0 4 5 + 1 2 3" it was trained on; the line printed keeps the user's input."""
    task = make_task("addition", pad_operands=True)
    model, params = tiny("tiny-gpt2", vocab_size=task.vocab.size, seed=2)
    save_workdir(tmp_path, model, params, DataConfig(task="addition", task_params=task.params))
    assert main([str(tmp_path), "--input", "4 5 + 1 2 3"]) == 0
    padded, unpadded = answers((task, model, params), ["0 4 5 + 1 2 3", "4 5 + 1 2 3"], Greedy(), 5)
    assert padded != unpadded  # the padding reaches the model
    assert capsys.readouterr().out.rstrip() == f"4 5 + 1 2 3 -> {padded}".rstrip()


def test_every_source_goes_through_one_text_path(monkeypatch, tmp_path):
    """A toy task's vocabulary, a corpus's tokenizer and an imported model's HF tokenizer take
    the same path through ``tfmjax.generate_text``: encode, the prompt layout (``source SEP``
    for a task only), one ``new_ids`` call (what differs: its defaults, sliding and batching),
    decode up to the model's EOS. ``new_ids`` is replaced: no model runs."""
    import importlib.util
    import types
    from pathlib import Path

    import tfmjax
    import tfmjax.generate as gen
    from tfmjax.api import Loaded
    from tfmjax.data.text import TextParams
    from tfmjax.data.tokenizers import train_tokenizer
    from tfmjax.data.vocab import EOS_ID
    from tfmjax.hf.tokenizer import read
    from tfmjax.models import build, preset

    fixture = Path(__file__).parents[1] / "hf" / "tokenizer_fixture.py"
    spec = importlib.util.spec_from_file_location("tokenizer_fixture", fixture)
    hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf)
    calls = []

    def new_ids(model, params, prompts, strategy, max_new, seed, *, slide, apart, crop):
        assert crop  # the default
        calls.append((prompts, strategy, max_new, slide, apart))
        return [[*p[-2:], EOS_ID, *p[:2]] for p in prompts]  # text after the EOS is cut

    monkeypatch.setattr(gen, "new_ids", new_ids)
    task = make_task("reverse", **TASK_PARAMS)
    corpus = types.SimpleNamespace(params=TextParams(sample_tokens=7, top_k=3, temperature=0.5))
    sources = {
        "task": (task.vocab, types.SimpleNamespace(task=task), "c a f"),
        "corpus": (train_tokenizer("char", ["ROMEO: hi"]), corpus, "ROMEO:"),
        "hf": (read(hf.model_dir("llama", tmp_path)), None, "the dog sat"),
    }
    model = build(preset("tiny-gpt2", vocab_size=96, max_len=32))  # EOS is id 2
    for name, (tokenizer, source, text) in sources.items():
        m = Loaded(model, {}, types.SimpleNamespace(model=model.config), tokenizer, 0, "", source)
        out = tfmjax.generate_text(m, text)
        (prompt,), strategy, max_new, slide, apart = calls[-1]
        ids = tokenizer.encode(text)
        assert prompt == (ids + [SEP_ID] if name == "task" else ids), name
        assert out == tokenizer.decode(prompt[-2:]), name
        assert (slide, apart) == (name != "task", name == "corpus"), name
    assert len(calls) == 3
    assert [c[1] for c in calls] == [Greedy(), TopK(3, 0.5), Greedy()]
    assert [c[2] for c in calls] == [task.max_target_len("eval") + 1, 7, 16]


def test_cli_crops_ids_longer_than_the_context_unless_no_crop(setup, workdir, capsys):
    """``--ids`` longer than the model's context: the last ids that leave room for the new
    ones are continued, one warning line says how many were dropped, and the answer is what
    those last ids alone give; ``--no-crop`` refuses in one line (exit 2)."""
    _, model, _ = setup
    max_len, new = model.config.max_len, 3
    ids = [5 + i % 4 for i in range(max_len + 2)]
    text = " ".join(map(str, ids))
    assert main([str(workdir), "--ids", text, "--max-new-tokens", str(new)]) == 0
    out, err = capsys.readouterr()
    kept = ids[-(max_len - new) :]
    assert err.startswith(f"warning: dropped the first {len(ids) - len(kept)} token(s)")
    assert len(err.splitlines()) == 1
    assert main([str(workdir), "--ids", " ".join(map(str, kept)), "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.split(" -> ")[1] == out.split(" -> ")[1]
    assert main([str(workdir), "--ids", text, "--max-new-tokens", str(new), "--no-crop"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err
