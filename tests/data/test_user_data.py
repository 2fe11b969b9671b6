"""Your own task class (PATH.py:Class, package.module:Class) and your own text file
(text:PATH): finding and importing them, the one-line errors, and finding them again from
the record a checkpoint keeps (tfmjax.data.user_data, sources, text)."""

import hashlib
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from tfmjax.config import ConfigError, DataConfig
from tfmjax.config.task_spec import TaskSpec, parse_task_spec
from tfmjax.data import Task, make_task, task_defaults, user_data
from tfmjax.data.sources import ToySource, is_text, open_source
from tfmjax.data.text import TextSource, split_play
from tfmjax.data.vocab import EOS_ID, MASK_ID, RESERVED_TOKENS

ROOT = Path(__file__).resolve().parents[2]
PARITY = ROOT / "examples" / "parity.py"

HEADER = "import dataclasses\nimport numpy as np\nfrom tfmjax.data import Task, Vocab\n\n"
TWO_CLASS = (
    "@dataclasses.dataclass(frozen=True, kw_only=True)\n"
    "class Twice(Task):\n"
    "    n: int = 3\n"
    "    def __post_init__(self):\n"
    "        object.__setattr__(self, 'vocab', Vocab(['x', 'y']))\n"
    "    def _generate(self, rng, long):\n"
    "        s = (rng.integers(0, 2, size=self.n) + 5).tolist()\n"
    "        return s, s + s\n"
    "    def _max_lengths(self, long):\n"
    "        return self.n, 2 * self.n\n"
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def error_of(task: str, params=None, **kw) -> str:
    with pytest.raises(ValueError) as info:
        open_source(task, params or {}, **kw)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# --------------------------------------------------------------------------- the forms


def test_task_spec_forms_and_config_validation():
    assert parse_task_spec("reverse") == TaskSpec("name", "reverse")
    assert parse_task_spec("text:notes/a.txt") == TaskSpec("text", "notes/a.txt")
    assert parse_task_spec("tasks/p.py:P") == TaskSpec("file", "tasks/p.py", "P")
    assert parse_task_spec("p.py:P") == TaskSpec("file", "p.py", "P")
    assert parse_task_spec("pkg.mod:P") == TaskSpec("module", "pkg.mod", "P")
    assert is_text("text:a.txt") and is_text("shakespeare") and not is_text("p.py:P")
    for task in ("examples/parity.py:ParityTask", "text:x.txt", "pkg.m:Cls", "reverse"):
        assert DataConfig(task=task).task == task  # the form is all the config checks
    for task, reason in (
        ("text:", "needs the path of a text file"),
        ("p.py:", "is not a class name"),
        ("a b:C", "is neither a .py file nor a module name"),
        ("", "give a task name"),
    ):
        with pytest.raises(ConfigError, match=reason) as info:
            DataConfig(task=task)
        assert str(info.value).startswith(f"data.task={task!r} is invalid")
        assert "\n" not in str(info.value)


# --------------------------------------------------------------------------- your own task


def test_a_task_file_by_relative_path_builds_with_its_params(tmp_path, monkeypatch):
    path = tmp_path / "tasks" / "parity.py"
    write(path, PARITY.read_text())
    monkeypatch.chdir(tmp_path)
    source = open_source("tasks/parity.py:ParityTask", {"max_len": 5})
    assert isinstance(source, ToySource) and source.task.name == "ParityTask"
    assert source.task.max_len == 5 and source.vocab_size == len(RESERVED_TOKENS) + 2
    rng = np.random.default_rng(0)
    for _ in range(50):  # the running parity, written from its definition
        src, tgt = source.task.sample(rng, "train")
        bits = [i - 5 for i in src]
        assert 1 <= len(bits) <= 5
        assert [i - 5 for i in tgt] == [sum(bits[: t + 1]) % 2 for t in range(len(bits))]
    origin = source.assets()["task_origin"]
    assert origin == {
        "task": "tasks/parity.py:ParityTask",
        "file": str(path.resolve()),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    assert task_defaults("tasks/parity.py:ParityTask") == {
        "min_len": 1,
        "max_len": 12,
        "scratchpad": True,
    }
    batch = source.batch(batch_format="prompt_answer", batch_size=4, seed=0, step=0)
    assert batch["tokens"].shape == (4, 5 + 5 + 2)  # source, SEP, target, EOS
    assert source.task.canonical_input("1011") == "1 0 1 1"
    assert source.task.canonical_input("1 0 1") == "1 0 1"


@pytest.fixture
def package(tmp_path, monkeypatch):
    """An importable package in the working folder, out of sys.modules afterwards."""
    name = f"own_{tmp_path.name.replace('-', '_')}"
    write(tmp_path / name / "__init__.py", "")
    write(tmp_path / name / "tasks.py", HEADER + TWO_CLASS)
    write(tmp_path / name / "broken.py", "import no_such_dependency_xyz\n")
    monkeypatch.chdir(tmp_path)
    yield name
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


def test_a_task_file_imports_the_modules_beside_it(tmp_path, monkeypatch):
    write(tmp_path / "lib" / "symbols_beside.py", "SYMBOLS = ['x', 'y']\n")
    body = HEADER + "from symbols_beside import SYMBOLS\n\n" + TWO_CLASS
    write(tmp_path / "lib" / "task.py", body.replace("['x', 'y']", "SYMBOLS"))
    monkeypatch.chdir(tmp_path)
    path_before = list(sys.path)
    assert open_source("lib/task.py:Twice", {}).task.vocab.symbols == ("x", "y")
    assert sys.path == path_before
    sys.modules.pop("symbols_beside", None)


def test_a_task_class_by_module_name(package, tmp_path, monkeypatch):
    assert str(tmp_path) not in sys.path  # the working folder is searched all the same
    source = open_source(f"{package}.tasks:Twice", {"n": 4})
    src, tgt = source.task.sample(np.random.default_rng(1), "eval")
    assert len(src) == 4 and tgt == src + src
    origin = source.assets()["task_origin"]
    assert origin["module"] == f"{package}.tasks"
    assert origin["file"] == str(tmp_path / package / "tasks.py")
    assert str(tmp_path) not in sys.path  # and left as it was
    assert "importing module" in error_of(f"{package}.broken:X")
    assert "No module named 'no_such_dependency_xyz'" in error_of(f"{package}.broken:X")
    for key in [k for k in sys.modules if k.startswith(package)]:
        del sys.modules[key]
    monkeypatch.chdir(tmp_path.parent)  # a checkpoint's module, gone from the search path
    assert error_of(f"{package}.tasks:Twice", origin=origin).startswith(
        f"no module named '{package}.tasks' for data.task='{package}.tasks:Twice' (it was "
        f"{tmp_path / package / 'tasks.py'} when trained): install it, or run from the folder"
    )


def test_each_mistake_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "t.py", HEADER + TWO_CLASS + "\nclass NotATask:\n    pass\n")
    abstract = "class Half(Task):\n    def _max_lengths(self, long):\n        return 1, 1\n"
    write(tmp_path / "half.py", HEADER + abstract)
    plain = TWO_CLASS.replace("@dataclasses.dataclass(frozen=True, kw_only=True)\n", "")
    write(tmp_path / "plain.py", HEADER + plain.replace("    n: int = 3\n", "    n = 3\n"))
    no_vocab = TWO_CLASS.replace("object.__setattr__(self, 'vocab', Vocab(['x', 'y']))", "pass")
    write(tmp_path / "novocab.py", HEADER + no_vocab)
    write(tmp_path / "required.py", HEADER + TWO_CLASS.replace("n: int = 3", "n: int"))
    write(tmp_path / "syntax.py", "x = 1\ny = (\n")
    write(tmp_path / "raises.py", "x = 1\ny = 1 / 0\n")

    assert error_of("missing.py:T") == (
        f"task file 'missing.py' of data.task='missing.py:T' does not exist (relative to "
        f"{tmp_path}): give the path of an existing file"
    )
    assert "has no class 'Twic'; did you mean 'Twice'? (tasks there: Twice)" in error_of(
        "t.py:Twic"
    )
    assert "NotATask in" in error_of("t.py:NotATask")
    assert "is not a task: a task is a subclass of tfmjax.data.Task" in error_of("t.py:NotATask")
    assert "is not a task" in error_of("t.py:Task")  # the interface itself
    assert "is not a task" in error_of("t.py:np")  # a module, not a class
    assert "does not define _generate" in error_of("half.py:Half")
    assert "is not a dataclass: decorate it with @dataclasses.dataclass" in error_of(
        "plain.py:Twice"
    )
    assert "must set self.vocab to a tfmjax.data.Vocab" in error_of("novocab.py:Twice")
    message = error_of("syntax.py:X")
    assert message.startswith(f"importing task file {tmp_path / 'syntax.py'} failed: SyntaxError")
    assert "(line 2)" in message
    assert error_of("raises.py:X") == (
        f"importing task file {tmp_path / 'raises.py'} failed: ZeroDivisionError: division by "
        "zero (line 2)"
    )
    assert error_of("no_such_module_xyz.tasks:T").startswith(
        "no module named 'no_such_module_xyz.tasks' for data.task='no_such_module_xyz.tasks:T': "
        "install it"
    )
    assert "unknown parameter 'm' for task 't.py:Twice'" in error_of("t.py:Twice", {"m": 1})
    message = error_of("required.py:Twice")  # a parameter without a default, not given
    assert message.startswith("building task 'required.py:Twice' failed: TypeError:")
    assert "'n'" in message
    assert "unknown task 'revers'; did you mean 'reverse'?" in error_of("revers")
    with pytest.raises(ValueError, match="names no task class"):
        make_task("text:corpus.txt")


def test_a_task_without_a_name_is_called_by_its_class():
    class Mine(Task):
        def _generate(self, rng, long):
            return [5], [5]

        def _max_lengths(self, long):
            return 1, 1

    assert Mine.name == "Mine"
    assert make_task("reverse").name == "reverse"  # a name of its own is kept


def test_a_moved_task_file_is_found_by_its_bytes_or_named(tmp_path, monkeypatch):
    old = write(tmp_path / "old" / "tasks" / "parity.py", PARITY.read_text())
    monkeypatch.chdir(tmp_path / "old")
    task = "tasks/parity.py:ParityTask"
    origin = open_source(task, {}).assets()["task_origin"]
    monkeypatch.chdir(tmp_path)  # elsewhere: the recorded absolute path still finds it
    assert open_source(task, {}, origin=origin).origin["file"] == str(old)

    new = tmp_path / "new"
    shutil.move(tmp_path / "old", new)
    monkeypatch.chdir(new)  # moved with its folder: the configured path has the same bytes
    assert open_source(task, {}, origin=origin).origin["file"] == str(new / "tasks/parity.py")
    monkeypatch.chdir(tmp_path)  # gone from both places
    assert error_of(task, origin=origin) == (
        f"task file {old} of data.task={task!r}, recorded in the checkpoint, is gone: put it "
        "back there, or run from a folder where tasks/parity.py is that same file"
    )
    (new / "tasks/parity.py").write_text(PARITY.read_text() + "# edited\n")
    monkeypatch.chdir(new)  # the file here is another one: opened, and its record says so
    edited = open_source(task, {}, origin=origin).origin
    assert edited["file"] == str(new / "tasks/parity.py")
    assert user_data.data_change(origin, edited) == (
        f"task file {new / 'tasks/parity.py'} of data.task={task!r} is not the one the "
        f"checkpoint was trained on (sha256 {origin['sha256'][:12]} recorded, "
        f"{edited['sha256'][:12]} now)"
    )


def test_a_data_change_is_seen_only_between_two_digests(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("one\n")
    task = f"text:{path}"
    before = user_data.text_file(task)[1]
    assert user_data.data_change(before, user_data.text_file(task, before)[1]) == ""
    path.write_text("two\n")
    after = user_data.text_file(task, before)[1]
    change = user_data.data_change(before, after)
    assert change.startswith(f"text file {path} of data.task={task!r} is not the one")
    assert before["sha256"][:12] in change and after["sha256"][:12] in change
    for nothing in (None, {}, {"task": task}):  # a built-in task, or nothing hashed
        assert user_data.data_change(nothing, after) == ""
        assert user_data.data_change(after, nothing) == ""


def test_a_module_task_records_its_file_and_a_module_without_one_says_so(tmp_path, monkeypatch):
    write(tmp_path / "mytasks" / "__init__.py", "")
    write(tmp_path / "mytasks" / "parity.py", PARITY.read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "modules", dict(sys.modules))  # the imports go with the test
    task = "mytasks.parity:ParityTask"
    record = user_data.task_class(task)[1]
    assert record["file"] == str(tmp_path / "mytasks" / "parity.py")
    assert record["sha256"] == hashlib.sha256(PARITY.read_bytes()).hexdigest()
    assert user_data.unhashable_module(record) == ""
    (tmp_path / "mytasks" / "parity.py").write_text(PARITY.read_text() + "# edited\n")
    edited = user_data.task_class(task, record)[1]  # the module's file is hashed again
    assert user_data.data_change(record, edited).startswith(
        f"module mytasks.parity {record['file']} of data.task={task!r} is not the one"
    )

    fileless = types.ModuleType("fileless_tasks")  # built in memory: no file to hash
    fileless.ParityTask = sys.modules["mytasks.parity"].ParityTask
    sys.modules["fileless_tasks"] = fileless
    record = user_data.task_class("fileless_tasks:ParityTask")[1]
    assert record == {"task": "fileless_tasks:ParityTask"}
    assert user_data.unhashable_module(record) == (
        "note: data.task='fileless_tasks:ParityTask' is a module without a file to hash: a "
        "checkpoint cannot tell whether it changes later"
    )
    assert user_data.unhashable_module({"task": "reverse"}) == ""


# --------------------------------------------------------------------------- your own text


LINES = [f"line {i}: the quick brown fox jumps over the lazy dog." for i in range(60)]


def test_a_text_file_trains_a_tokenizer_on_its_training_part(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = "\n".join(LINES) + "\ncaf\u00e9\n"  # the é is in the validation part only
    write(tmp_path / "corpus.txt", text)
    source = open_source("text:corpus.txt", {"context": 16})
    assert isinstance(source, TextSource)
    train, valid = split_play(text)
    assert train + valid == text and train.endswith("\n")
    assert 0.85 * len(text) < len(train) <= 0.9 * len(text)
    symbols = source.tokenizer.symbols
    assert set(symbols[:-1]) == set(train) and symbols[-1] == "\u00e9"
    assert source.num_chars == {"train": len(train), "eval": len(valid)}
    # the token files: each part, char by char, then EOS
    expect = [
        [len(RESERVED_TOKENS) + symbols.index(ch) for ch in part] + [EOS_ID]
        for part in (train, valid)
    ]
    assert source.ids["train"].tolist() == expect[0]
    assert source.ids["eval"].tolist() == expect[1]
    assets = source.assets()
    assert assets["tokenizer"]["kind"] == "char"
    assert assets["task_origin"]["file"] == str(tmp_path / "corpus.txt")
    again = open_source("text:corpus.txt", {"context": 16})  # from the cache
    assert again.tokenizer.symbols == symbols
    window = again.windows(batch_size=3, seed=0, step=0, split="eval")
    assert window.shape == (3, 16)
    masked = again.batch(batch_format="masked_lm", batch_size=4, seed=0, step=1)
    assert masked["targets"].shape == (4, 16)
    assert ((masked["tokens"] == MASK_ID) <= (masked["loss_mask"] > 0)).all()

    bpe = open_source("text:corpus.txt", {"tokenizer": "bpe", "vocab_size": 300, "context": 8})
    assert bpe.tokenizer.kind == "bpe" and bpe.vocab_size <= 300


def test_a_text_without_line_ends_is_split_at_the_mark():
    train, valid = split_play("x" * 100)
    assert (len(train), len(valid)) == (90, 10)


def test_text_file_mistakes_are_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert error_of("text:nope.txt") == (
        f"text file 'nope.txt' of data.task='text:nope.txt' does not exist (relative to "
        f"{tmp_path}): give the path of an existing file"
    )
    write(tmp_path / "empty.txt", " \n\n")
    assert error_of("text:empty.txt") == (
        f"text file {tmp_path / 'empty.txt'} is empty: give a file that holds the text to learn"
    )
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    assert error_of("text:latin1.txt").startswith(
        f"text file {tmp_path / 'latin1.txt'} is not UTF-8 text (byte 3:"
    )
    write(tmp_path / "short.txt", "\n".join(LINES[:3]))
    assert "tokens, not more than context=64: give a longer text or a smaller" in error_of(
        "text:short.txt"
    )
    assert "unknown parameter 'contex' for a text task" in error_of("text:short.txt", {"contex": 8})


def test_explain_lists_your_task_and_text(monkeypatch, capsys):
    from tfmjax.config import explain

    monkeypatch.chdir(ROOT)
    assert explain.main(["configs/parity.toml"]) == 0
    out = capsys.readouterr().out
    assert "examples/parity.py:ParityTask (your task) min_len=1, max_len=12, scratchpad=True" in out
    table = explain.tasks_table("text:notes.txt")
    assert "text:notes.txt" in table and "(your text) tokenizer='char'" in table
    assert "(your task) cannot be loaded here: task file 'gone.py'" in explain.tasks_table(
        "gone.py:T"
    )


# ------------------------------------------- members a task answers, in any form users write

NO_LENGTH_FORMS = {
    "method": "    def supports_length_split(self):\n        return False\n",
    "property": "    @property\n    def supports_length_split(self):\n        return False\n",
    "class attribute": "    supports_length_split = False\n",
}


@pytest.mark.parametrize("form", NO_LENGTH_FORMS)
def test_a_task_without_a_length_split_is_refused_it_however_it_says_so(tmp_path, form):
    """docs/own_data.md: "A task without one overrides supports_length_split to return
    False". Written as a plain method it was a bound method, always true, and eval.py
    --split length scored examples of a split the task does not define."""
    path = tmp_path / "nolength.py"
    write(
        path,
        HEADER
        + TWO_CLASS.replace("class Twice(Task):\n", "class Twice(Task):\n" + NO_LENGTH_FORMS[form]),
    )
    source = open_source(f"{path}:Twice", {})
    assert source.task.supports_length_split is False
    with pytest.raises(ValueError, match="task 'Twice' has no 'length' split"):
        source.check_split("length")
    with pytest.raises(ValueError, match="no 'length' split"):
        source.batch(batch_format="seq2seq", batch_size=2, seed=0, step=0, split="length")
    source.check_split("eval")  # the other splits stay


def test_digit_ids_written_as_a_method_answer_as_a_value(tmp_path):
    path = tmp_path / "digits.py"
    digits = "    def digit_ids(self):\n        return (5, 6)\n"
    write(path, HEADER + TWO_CLASS.replace("class Twice(Task):\n", "class Twice(Task):\n" + digits))
    assert open_source(f"{path}:Twice", {}).digit_ids == (5, 6)


def test_a_task_name_written_as_a_method_is_refused_in_one_line(tmp_path):
    path = tmp_path / "named.py"
    named = "    def name(self):\n        return 'twice'\n"
    write(path, HEADER + TWO_CLASS.replace("class Twice(Task):\n", "class Twice(Task):\n" + named))
    with pytest.raises(ValueError) as err:
        open_source(f"{path}:Twice", {})
    assert str(err.value).endswith(
        "TypeError: task Twice: name is a method; give it as a class attribute "
        "(name = 'twice') or a property (line 6)"
    )
