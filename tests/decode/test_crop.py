"""Prompts longer than the context: decoder-only ones are cropped (one line on stderr),
``crop=False`` and encoder inputs refuse."""

import numpy as np
import pytest

from tfmjax.decode import Greedy, generate


def test_long_prompt_keeps_its_last_tokens(tiny, capsys):
    model, params = tiny("tiny-gpt2")  # learned positions, max_len 32
    long = [5 + (i % 9) for i in range(40)]
    out = generate(model, params, [long, [7, 3]], Greedy(), 4)  # room for 32 - 4 = 28
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dropped the first 12 token(s)" in err
    ref = generate(model, params, [long[-28:], [7, 3]], Greedy(), 4)
    assert capsys.readouterr().err == ""
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    with pytest.raises(ValueError, match="exceeds model.max_len=32"):
        generate(model, params, [long], Greedy(), 4, crop=False)


def test_encoder_inputs_are_never_cropped(tiny):
    model, params = tiny("tiny-vaswani")
    with pytest.raises(ValueError, match="encoder input length 40 exceeds model.max_len=32"):
        generate(model, params, [[5] * 39 + [2]], Greedy(), 4)
