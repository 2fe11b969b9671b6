"""Toy tasks: answers recomputed independently, split hygiene, vocab and registry errors."""

import re

import numpy as np
import pytest

from tfmjax.data import (
    BOS_ID,
    EOS_ID,
    MASK_ID,
    PAD_ID,
    SEP_ID,
    TASK_NAMES,
    Vocab,
    example_split,
    make_task,
    task_defaults,
)
from tfmjax.data.grammar import enumerate_commands

EXPECTED_TASKS = {
    "copy",
    "reverse",
    "sort",
    "addition",
    "addition_reversed",
    "scan",
    "dyck",
    "associative_recall",
    "induction_head",
}


def _samples(task, split, n, seed=0):
    rng = np.random.default_rng(seed)
    return [task.sample(rng, split) for _ in range(n)]


def _words(task, ids):
    return task.vocab.decode(ids).split()


# --------------------------------------------------------------------------- independent checkers


def _scan_meaning(command: str) -> list[str]:
    """Independent SCAN interpreter, written from the paper's interpretation rules."""
    for conj in (" and ", " after "):
        if conj in command:
            left, right = command.split(conj)
            a, b = _scan_meaning(left), _scan_meaning(right)
            return a + b if conj == " and " else b + a
    words = command.split()
    if words[-1] in ("twice", "thrice"):
        return _scan_meaning(" ".join(words[:-1])) * (2 if words[-1] == "twice" else 3)
    act = [] if words[0] == "turn" else [words[0].upper()]
    if len(words) == 1:
        assert words[0] != "turn"
        return act
    turn = {"left": "LTURN", "right": "RTURN"}[words[-1]]
    if len(words) == 2:
        return [turn] + act
    if words[1] == "opposite":
        return [turn, turn] + act
    assert words[1] == "around" and len(words) == 3
    return ([turn] + act) * 4


def _check_answer(task, source, target):
    src, tgt = _words(task, source), _words(task, target)
    name = task.name
    if name == "copy":
        assert tgt == src
    elif name == "reverse":
        assert tgt == src[::-1]
    elif name == "sort":
        assert tgt == sorted(src)  # letters: alphabetical == id order
    elif name in ("addition", "addition_reversed"):
        plus = src.index("+")
        a, b = "".join(src[:plus]), "".join(src[plus + 1 :])
        assert a == str(int(a)) and b == str(int(b)), "no leading zeros"
        answer = str(int(a) + int(b))
        assert "".join(tgt) == (answer[::-1] if name == "addition_reversed" else answer)
    elif name == "scan":
        assert tgt == _scan_meaning(" ".join(src))
    elif name == "dyck":
        pairs = {")": "(", "]": "[", "}": "{", ">": "<"}
        stack, max_depth = [], 0
        for i, tok in enumerate(src + tgt):
            if tok in pairs:
                assert stack and stack.pop() == pairs[tok], "unbalanced"
            else:
                assert i < len(src), "target may only close brackets"
                stack.append(tok)
            max_depth = max(max_depth, len(stack))
        assert not stack, "source + target must be balanced"
        assert tgt and all(t in pairs for t in tgt), "target = non-empty closing sequence"
        assert max_depth <= task.max_depth
    elif name == "associative_recall":
        *pairs, q_mark, query = src
        keys, values = pairs[0::2], pairs[1::2]
        assert q_mark == "?" and len(keys) == len(values) and len(set(keys)) == len(keys)
        assert tgt == [values[keys.index(query)]]
    elif name == "induction_head":
        *body, q = src
        assert body.count(q) == 1, "query occurs exactly once before"
        i = body.index(q)
        assert tgt == body[i + 1 : i + 1 + task.continuation_len]
        assert len(tgt) == task.continuation_len
    else:
        raise AssertionError(f"no checker for {name}")


# --------------------------------------------------------------------------- tasks


def test_task_names():
    assert set(TASK_NAMES) == EXPECTED_TASKS


@pytest.mark.parametrize("name", TASK_NAMES)
@pytest.mark.parametrize("split", ["train", "eval", "length"])
def test_targets_are_correct_and_within_max_lengths(name, split):
    task = make_task(name)
    assert task.name == name
    for source, target in _samples(task, split, 300):
        assert all(isinstance(i, int) for i in source + target)
        assert all(5 <= i < task.vocab.size for i in source + target), (
            "no reserved ids, all in vocab"
        )
        assert 1 <= len(source) <= task.max_source_len(split)
        assert 1 <= len(target) <= task.max_target_len(split)
        _check_answer(task, source, target)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_eval_never_overlaps_train(name):
    task = make_task(name)
    train = {tuple(s) for s, _ in _samples(task, "train", 2000, seed=1)}
    evals = {tuple(s) for s, _ in _samples(task, "eval", 2000, seed=2)}
    assert len(evals) > 1 and not train & evals
    assert {example_split(s) for s in train} == {"train"}
    assert {example_split(s) for s in evals} == {"eval"}


@pytest.mark.parametrize("name", TASK_NAMES)
def test_length_split_is_longer(name):
    task = make_task(name)
    assert task.supports_length_split
    # SCAN's length split is over action (target) length; the others over source length.
    which = 1 if name == "scan" else 0
    train_max = max(len(ex[which]) for ex in _samples(task, "train", 500))
    length_min = min(len(ex[which]) for ex in _samples(task, "length", 500))
    assert length_min > train_max
    assert task.max_source_len("length") >= task.max_source_len("train")
    assert task.max_target_len("length") >= task.max_target_len("train")
    assert task.max_source_len("eval") == task.max_source_len("train")
    assert task.max_target_len("eval") == task.max_target_len("train")


@pytest.mark.parametrize("name", TASK_NAMES)
def test_sampling_is_a_function_of_the_rng(name):
    task = make_task(name)
    assert _samples(task, "train", 50, seed=7) == _samples(task, "train", 50, seed=7)
    assert _samples(task, "train", 50, seed=7) != _samples(task, "train", 50, seed=8)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_params_rebuild_the_task(name):
    task = make_task(name)
    assert make_task(name, **task.params) == task
    assert set(task_defaults(name)) <= set(task.params)


def test_defaults_are_small():
    assert make_task("copy").params == {"num_symbols": 10, "min_len": 1, "max_len": 10}
    assert make_task("addition").params == {
        "num_digits": 3,
        "reversed_answer": False,
        "exact_digits": False,
        "pad_operands": False,
        "reversed_operands": False,
    }
    assert make_task("addition_reversed").reversed_answer


def test_example_split_is_stable():
    # A stable hash (not hash()): these buckets are the same in every process and release.
    assert [i for i in range(100) if example_split([i, 5]) == "eval"] == [
        13,
        61,
        62,
        66,
        82,
        83,
        87,
        92,
    ]
    assert example_split(np.array([13, 5], np.int32)) == "eval"
    fractions = np.mean([example_split([i, j]) == "eval" for i in range(100) for j in range(100)])
    assert 0.07 < fractions < 0.13


def test_exact_digits_gives_operands_of_exactly_num_digits():
    task = make_task("addition_reversed", num_digits=6, exact_digits=True)
    for source, target in _samples(task, "eval", 50):
        _check_answer(task, source, target)
        a, b = task.vocab.decode(source).replace(" ", "").split("+")
        assert len(a) == len(b) == 6 and a[0] != "0" and b[0] != "0"
    with pytest.raises(ValueError, match="exact_digits must be a bool"):
        make_task("addition", exact_digits=1)


def test_pad_operands_writes_both_operands_at_the_widest_width():
    for name, answer_order in (("addition", 1), ("addition_reversed", -1)):
        task = make_task(name, num_digits=4, pad_operands=True)
        for split, width in (("train", 4), ("eval", 4), ("length", 8)):
            for source, target in _samples(task, split, 50):
                a, b = task.vocab.decode(source).replace(" ", "").split("+")
                assert len(a) == len(b) == width
                answer = task.vocab.decode(target).replace(" ", "")[::answer_order]
                assert answer == str(int(a) + int(b))  # no leading zeros in the answer
    with pytest.raises(ValueError, match="pad_operands must be a bool"):
        make_task("addition", pad_operands="yes")


def test_reversed_operands_write_every_number_least_significant_first():
    """McLeish et al.'s order: operands and answer all least significant first, so a digit's
    place in its number is its place value; padding zeros trail."""
    task = make_task("addition_reversed", num_digits=4, reversed_operands=True, pad_operands=True)
    for split, width in (("train", 4), ("length", 8)):
        for source, target in _samples(task, split, 50):
            a, b = (o[::-1] for o in task.vocab.decode(source).replace(" ", "").split("+"))
            assert len(a) == len(b) == width  # read back most significant first
            assert task.vocab.decode(target).replace(" ", "")[::-1] == str(int(a) + int(b))
    assert task.canonical_input("5 4 + 3 2 1") == "5 4 0 0 + 3 2 1 0"
    with pytest.raises(ValueError, match="reversed_operands must be a bool"):
        make_task("addition", reversed_operands=1)


def test_task_params_change_the_data():
    task = make_task("reverse", num_symbols=20, min_len=3, max_len=5)
    assert task.vocab.size == 25
    for source, target in _samples(task, "train", 200):
        assert 3 <= len(source) <= 5
        assert target == source[::-1]
    task = make_task("addition", num_digits=5, reversed_answer=True)
    assert task.name == "addition_reversed"
    assert task.max_source_len("train") == 11 and task.max_target_len("train") == 6
    for source, target in _samples(task, "length", 100):
        _check_answer(task, source, target)
        a = task.vocab.decode(source).split(" + ")[0].replace(" ", "")
        assert 6 <= len(a) <= 10
    task = make_task("induction_head", continuation_len=3, min_len=5, max_len=9)
    for source, target in _samples(task, "train", 200):
        _check_answer(task, source, target)
    task = make_task("dyck", num_types=3, max_depth=3, max_len=20)
    for source, target in _samples(task, "length", 200):
        _check_answer(task, source, target)


# --------------------------------------------------------------------------- SCAN grammar


def test_scan_known_examples():
    expected = {
        "jump twice and walk left": "JUMP JUMP LTURN WALK",
        "walk after run opposite left": "LTURN LTURN RUN WALK",
        "turn around right": "RTURN RTURN RTURN RTURN",
        "look around left twice": " ".join(["LTURN LOOK"] * 8),
        "turn opposite right thrice": " ".join(["RTURN RTURN"] * 3),
        "jump": "JUMP",
        "run right after turn left": "LTURN RTURN RUN",
    }
    commands = dict(enumerate_commands())
    assert len(commands) == len(enumerate_commands()) == 20910
    for cmd, actions in expected.items():
        assert commands[cmd] == actions
        assert _scan_meaning(cmd) == actions.split()
    assert "turn" not in commands and "turn twice" not in commands


def test_scan_splits_by_action_count():
    task = make_task("scan")
    assert task.max_source_len("train") == 9 and task.max_target_len("train") == 22
    assert task.max_target_len("length") == 48
    assert all(len(t) > 22 for _, t in _samples(task, "length", 300))


# --------------------------------------------------------------------------- length split errors


def test_unsupported_length_split_raises():
    task = make_task("associative_recall", num_keys=6, max_pairs=6)
    assert not task.supports_length_split
    with pytest.raises(
        ValueError, match="task 'associative_recall' has no 'length' split: max_pairs"
    ):
        task.sample(np.random.default_rng(0), "length")
    with pytest.raises(ValueError, match="no 'length' split"):
        task.max_source_len("length")
    scan = make_task("scan", max_actions=48)
    with pytest.raises(ValueError, match="task 'scan' has no 'length' split"):
        scan.sample(np.random.default_rng(0), "length")


def test_unknown_split_raises():
    with pytest.raises(
        ValueError, match=r"unknown split 'test'; valid splits: train, eval, length"
    ):
        make_task("copy").sample(np.random.default_rng(0), "test")


# --------------------------------------------------------------------------- vocab


def test_reserved_ids():
    assert (PAD_ID, BOS_ID, EOS_ID, SEP_ID, MASK_ID) == (0, 1, 2, 3, 4)
    vocab = Vocab(["a", "b"])
    assert vocab.tokens == ("<pad>", "<bos>", "<eos>", "<sep>", "<mask>", "a", "b")
    assert vocab.size == len(vocab) == 7


@pytest.mark.parametrize("name", TASK_NAMES)
def test_vocab_round_trip(name):
    task = make_task(name)
    for source, target in _samples(task, "train", 50):
        for ids in (source, target):
            assert task.vocab.encode(task.vocab.decode(ids)) == ids


def test_vocab_decode_stops_at_eos_and_skips_pad_bos():
    vocab = Vocab(["a", "b", "c"])
    assert vocab.encode("a  c b") == [5, 7, 6]
    assert vocab.encode("") == []
    assert vocab.decode([BOS_ID, 5, PAD_ID, 7, EOS_ID, 6, 6]) == "a c"
    assert vocab.decode(np.array([5, SEP_ID, 6], np.int32)) == "a <sep> b"
    assert vocab.encode("a <sep> b") == [5, SEP_ID, 6]


def test_vocab_unknown_symbol_message():
    with pytest.raises(ValueError) as err:
        Vocab(["a", "b"]).encode("a zz b")
    msg = str(err.value)
    assert "\n" not in msg and "'zz'" in msg and "a, b" in msg
    with pytest.raises(ValueError) as err:
        Vocab([f"w{i}" for i in range(100)]).encode("nope")
    msg = str(err.value)
    assert "'nope'" in msg and "w0, w1" in msg and "(+80 more)" in msg and "w99" not in msg


def test_vocab_rejects_bad_symbols():
    with pytest.raises(ValueError, match="duplicate"):
        Vocab(["a", "a"])
    with pytest.raises(ValueError, match="duplicate"):
        Vocab(["<pad>"])
    with pytest.raises(ValueError, match="whitespace"):
        Vocab(["a b"])


def test_vocab_is_frozen_and_hashable():
    vocab = Vocab(["a"])
    assert hash(vocab) == hash(Vocab(("a",))) and vocab == Vocab(("a",))
    with pytest.raises(AttributeError):
        vocab.symbols = ("b",)


# --------------------------------------------------------------------------- registry errors


def test_unknown_task_message():
    with pytest.raises(ValueError) as err:
        make_task("revrse")
    msg = str(err.value)
    assert msg.startswith(
        "unknown task 'revrse'; did you mean 'reverse'? (valid tasks: copy, reverse"
    )
    assert "\n" not in msg
    with pytest.raises(ValueError, match=r"^unknown task 'zzz' \(valid tasks: "):
        make_task("zzz")


def test_unknown_param_message():
    with pytest.raises(ValueError) as err:
        make_task("copy", max_length=5)
    assert str(err.value) == (
        "unknown parameter 'max_length' for task 'copy'; did you mean 'max_len'? "
        "(valid parameters: num_symbols, min_len, max_len)"
    )
    with pytest.raises(
        ValueError, match=re.escape("unknown parameters 'foo', 'bar' for task 'dyck'")
    ):
        make_task("dyck", foo=1, bar=2)
    with pytest.raises(ValueError, match="fixed to True by task name 'addition_reversed'"):
        make_task("addition_reversed", reversed_answer=False)


def test_bad_param_values():
    with pytest.raises(ValueError, match=r"task 'copy': max_len must be an int >= 3, got 2"):
        make_task("copy", min_len=3, max_len=2)
    with pytest.raises(
        ValueError, match=r"task 'addition': num_digits must be an int >= 1, got 1.5"
    ):
        make_task("addition", num_digits=1.5)
    with pytest.raises(ValueError, match=r"num_keys must be an int in \[2, 26\]"):
        make_task("associative_recall", num_keys=40)


def test_canonical_input_pads_what_a_person_types():
    task = make_task("addition", pad_operands=True)
    assert task.canonical_input("4 5 + 1 2 3") == "0 4 5 + 1 2 3"
    assert task.canonical_input("0 + 7") == "0 0 0 + 0 0 7"
    assert task.canonical_input("1 2 3 4 + 5") == "0 0 1 2 3 4 + 0 0 0 0 0 5"  # length split
    assert task.canonical_input("+ 5") == "+ 5"  # malformed: left for the model's checks
    for split in ("eval", "length"):  # what the task writes is left as it is
        for source, _ in _samples(task, split, 20):
            text = task.vocab.decode(source)
            assert task.canonical_input(text) == text
    assert make_task("addition").canonical_input("4 5 + 1") == "4 5 + 1"
    assert make_task("reverse").canonical_input("a b") == "a b"
