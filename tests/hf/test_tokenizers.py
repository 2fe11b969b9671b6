"""Tokenizers travel with imported models: ``hf import`` stores the ``tokenizer.json`` beside the
weights in the checkpoint, ``generate --input "text"`` encodes with it and prints text, and
``hf export`` writes it back.

The models and their tokenizers are those of ``tokenizer_fixture.py`` (a small byte-level
BPE trained there per architecture). The ids Hugging Face's tokenizer gives come from
``transformers``'s ``AutoTokenizer`` when it is installed, else from
``goldens/tokenizers.json``, which ``python tests/hf/test_tokenizers.py`` rewrites (with
transformers installed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from tfmjax.checkpoint import load_assets
from tfmjax.generate import main as generate_main
from tfmjax.hf.cli import main as hf_main

HERE = Path(__file__).parent
GOLDENS = HERE / "goldens"
TOKENIZER_GOLDENS = GOLDENS / "tokenizers.json"
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def load_fixture():
    spec = importlib.util.spec_from_file_location(
        "tokenizer_fixture", HERE / "tokenizer_fixture.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PROMPT = "the dog sat on"
NEW = 6  # new tokens generated (the tiny models hold 32 positions)
FIXTURE = load_fixture()
CASES, TEXT, train_tokenizer, model_dir = (
    FIXTURE.CASES,
    FIXTURE.TEXT,
    FIXTURE.train_tokenizer,
    FIXTURE.model_dir,
)


def hf_reference(directory: Path, text: str, ids: list[int]) -> dict:
    """What transformers' tokenizer in ``directory`` makes of ``text`` and ``ids``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(directory))
    return {
        "input_ids": tok(text)["input_ids"],
        "decoded": tok.decode(ids, skip_special_tokens=True),
        "special": [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id],
    }


def golden_of(case: str) -> dict:
    """The committed golden of ``case``, once the BPE trained here is checked to be the one
    it was made with (a ``tokenizers`` release that trains differently says so)."""
    golden = json.loads(TOKENIZER_GOLDENS.read_text())[case]
    assert train_tokenizer(case).encode(TEXT).ids == golden["text_ids"], (
        "the BPE trained here differs from the one goldens/tokenizers.json was made with: "
        "rerun python tests/hf/test_tokenizers.py with transformers installed"
    )
    return golden


def reference(case: str, directory: Path, ids: list[int]) -> dict:
    """Live transformers when installed, else the committed golden of ``case``."""
    if HAS_TRANSFORMERS:
        return hf_reference(directory, PROMPT, ids)
    return golden_of(case)


def run_cli(main, argv, capsys) -> str:
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def generated(case: str, root: Path, capsys) -> dict:
    """Import ``case`` with its tokenizer, then generate from the text and from the ids."""
    work = root / "work"
    run_cli(hf_main, ["import", model_dir(case, root), work], capsys)
    out = run_cli(generate_main, [work, "--input", PROMPT, "--max-new-tokens", NEW], capsys)
    text = out.strip().split(" -> ", 1)[1] if " -> " in out else ""
    assert out.startswith(f"{PROMPT} -> ")
    return {"work": work, "text": text}


@pytest.mark.parametrize("case", sorted(CASES))
def test_generating_from_text_equals_generating_from_hf_tokenizer_ids(case, tmp_path, capsys):
    got = generated(case, tmp_path, capsys)
    saved = load_assets(got["work"], 0)["tokenizer"]
    golden = golden_of(case)
    ids = reference(case, tmp_path / f"{case}_hf", [])["input_ids"]
    assert ids == golden["input_ids"]  # the live tokenizer agrees with the golden one
    prompt = " ".join(map(str, ids))
    out = run_cli(generate_main, [got["work"], "--ids", prompt, "--max-new-tokens", NEW], capsys)
    new = [int(t) for t in out.split(" -> ")[1].split()]
    want = reference(case, tmp_path / f"{case}_hf", new)
    if not HAS_TRANSFORMERS:  # the golden decoded the ids these are
        assert new == golden["generated"]
    assert [saved["bos_id"], saved["eos_id"], saved["pad_id"]] == want["special"]
    assert got["text"] == want["decoded"]
    if case == "llama":
        assert ids[0] == saved["bos_id"]  # Llama's tokenizer adds BOS; GPT-2's does not
    if case == "t5":
        assert ids[-1] == saved["eos_id"]


def test_generation_from_text_stops_at_the_eos(tmp_path, capsys):
    """With the model's EOS (generation_config.json) set to a token its greedy continuation
    reaches, the printed text ends before it."""
    golden = golden_of("llama")
    first = generated("llama", tmp_path / "a", capsys)
    ids = " ".join(map(str, golden["input_ids"]))
    out = run_cli(generate_main, [first["work"], "--ids", ids, "--max-new-tokens", NEW], capsys)
    new = [int(t) for t in out.split(" -> ")[1].split()]
    k = next(k for k in range(1, len(new)) if new[k] not in new[:k])
    directory = model_dir("llama", tmp_path / "b")
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": new[k]}))
    work = tmp_path / "b" / "work"
    run_cli(hf_main, ["import", directory, work], capsys)
    out = run_cli(generate_main, [work, "--input", PROMPT, "--max-new-tokens", NEW], capsys)
    tokenizer = train_tokenizer("llama")
    assert out.strip() == f"{PROMPT} -> {tokenizer.decode(new[:k], skip_special_tokens=True)}"
    assert first["text"] == tokenizer.decode(new, skip_special_tokens=True)


def test_text_continues_past_the_context_by_sliding_its_window(tmp_path, capsys):
    """An imported model's --input continues past model.max_len (32 here) as a text task's
    model does, instead of refusing prompt + new tokens over it: the window slides
    (generate.continue_text); up to the context's end it is the plain continuation."""
    work = generated("gpt2", tmp_path, capsys)["work"]
    room = 32 - len(train_tokenizer("gpt2").encode(PROMPT).ids)  # GPT-2 adds no BOS
    whole = run_cli(generate_main, [work, "--input", PROMPT, "--max-new-tokens", 40], capsys)
    start = run_cli(generate_main, [work, "--input", PROMPT, "--max-new-tokens", room], capsys)
    assert whole.startswith(start.rstrip("\n")) and len(whole) > len(start)


@pytest.mark.parametrize("case", ["llama", "t5"])
def test_export_writes_the_tokenizer_back(case, tmp_path, capsys):
    work, out = tmp_path / "work", tmp_path / "out"
    directory = model_dir(case, tmp_path)
    run_cli(hf_main, ["import", directory, work], capsys)
    run_cli(hf_main, ["export", work, out], capsys)
    original = train_tokenizer(case)
    from tokenizers import Tokenizer

    back = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert back.encode(TEXT).ids == original.encode(TEXT).ids
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert {k: config[k] for k in CASES[case]["config"]} == CASES[case]["config"]
    again = tmp_path / "again"
    run_cli(hf_main, ["import", out, again], capsys)
    assert load_assets(again, 0)["tokenizer"] == load_assets(work, 0)["tokenizer"]
    if HAS_TRANSFORMERS:
        ids = original.encode(TEXT).ids
        assert hf_reference(out, TEXT, ids) == hf_reference(directory, TEXT, ids)


def test_export_keeps_the_imported_dtype_and_normal_file_modes(tmp_path, capsys):
    work, out = tmp_path / "work", tmp_path / "out"
    run_cli(hf_main, ["import", model_dir("gpt2", tmp_path), work], capsys)
    old = os.umask(0o022)
    try:
        run_cli(hf_main, ["export", work, out], capsys)
    finally:
        os.umask(old)
    tensors = load_file(out / "model.safetensors")
    assert {str(a.dtype) for a in tensors.values()} == {"float16"}
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"
    for path in out.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, path.name


def test_a_run_fine_tuned_from_an_import_exports_its_dtype_and_tokenizer(tmp_path, capsys):
    """Two steps on a toy task from the imported GPT-2: the export is float16 as the
    original, with the tokenizer files, although the fine-tuned workdir holds neither."""
    from tfmjax.config import load
    from tfmjax.train.loop import train

    work, tuned, out = tmp_path / "work", tmp_path / "tuned", tmp_path / "out"
    run_cli(hf_main, ["import", model_dir("gpt2", tmp_path), work], capsys)
    overrides = ["data.task=copy", "data.batch_size=2", "data.eval_examples=2", "train.steps=2"]
    overrides += ["train.eval_every=10", "train.checkpoint_every=2", "optim.warmup_steps=1"]
    overrides += [f"train.workdir={tuned}"]
    experiment = load(work / "finetune.toml", overrides)
    assert train(experiment, plot=False)["step"] == 2
    run_cli(hf_main, ["export", tuned, out], capsys)
    assert {str(a.dtype) for a in load_file(out / "model.safetensors").values()} == {"float16"}
    from tokenizers import Tokenizer

    back = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert back.encode(TEXT).ids == train_tokenizer("gpt2").encode(TEXT).ids
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == 95


def test_without_a_tokenizer_import_hints_and_generate_input_says_what_to_do(tmp_path, capsys):
    work = tmp_path / "work"
    out = run_cli(hf_main, ["import", model_dir("gpt2", tmp_path, tokenizer=False), work], capsys)
    assert out.count("\n") == 2 and "hint: no tokenizer.json beside the weights" in out
    assert generate_main([str(work), "--input", PROMPT]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "generate takes --ids only" in err
    assert generate_main([str(work), "--ids", "40 41", "--max-new-tokens", "2"]) == 0


def test_special_ids_come_from_the_first_file_that_names_them(tmp_path):
    from tfmjax import hf
    from tfmjax.hf import tokenizer as hf_tokenizer

    directory = model_dir("llama", tmp_path)
    tok = hf.load_tokenizer(directory)
    assert tok.encode(TEXT) == train_tokenizer("llama").encode(TEXT).ids
    assert tok.encode(TEXT)[0] == tok.bos_id == 1  # the post-processor's BOS
    assert tok.decode(tok.encode(TEXT)) == TEXT and hf.load_tokenizer(tmp_path) is None
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    (directory / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": {"content": "<s>"}, "eos_token": "<unk>"})
    )
    (directory / "generation_config.json").write_text(json.dumps({"pad_token_id": [0, 2]}))
    got = hf_tokenizer.read(directory)
    assert (got.bos_id, got.eos_id, got.pad_id) == (1, 2, 0)
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<nope>"}))
    with pytest.raises(hf_tokenizer.HFError, match="eos_token '<nope>' is not in tokenizer.json"):
        hf_tokenizer.read(directory)
    (directory / "tokenizer.json").write_text("{")
    with pytest.raises(hf_tokenizer.HFError, match="is not a tokenizer the tokenizers package"):
        hf_tokenizer.read(directory)


def write_goldens(root: Path) -> None:
    """Rewrite goldens/tokenizers.json with transformers' ids (run as a script)."""
    import contextlib
    import io

    goldens = {}
    for case in sorted(CASES):
        directory = model_dir(case, root / case)
        ids = hf_reference(directory, PROMPT, [])["input_ids"]
        work = root / case / "work"
        assert hf_main(["import", str(directory), str(work)]) == 0
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            args = [str(work), "--ids", " ".join(map(str, ids)), "--max-new-tokens", str(NEW)]
            assert generate_main(args) == 0
        new = [int(t) for t in buffer.getvalue().split(" -> ")[1].split()]
        text_ids = train_tokenizer(case).encode(TEXT).ids
        goldens[case] = {**hf_reference(directory, PROMPT, new), "generated": new}
        goldens[case]["text_ids"] = text_ids
    cases = [
        f"  {json.dumps(case)}: {{\n"
        + ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in fields.items())
        + "\n  }"
        for case, fields in goldens.items()
    ]
    TOKENIZER_GOLDENS.write_text("{\n" + ",\n".join(cases) + "\n}\n")  # one field a line


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        write_goldens(Path(tmp))
    sys.exit(0)
