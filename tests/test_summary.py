"""The parameter table: every module's rows add up to the total, and the CLI prints it."""

import re

from tfmjax.models import get_preset
from tfmjax.summary import count_params, main, summarize


def test_rows_add_up_to_total():
    """The table's rows add up to its total, which is tiny-llama's count worked out by hand."""
    config = get_preset("tiny-llama")
    table = summarize(config)
    counts = [
        int(m.group(1).replace(",", "")) for m in re.finditer(r"^\S+\s+([\d,]+)\s", table, re.M)
    ]
    V, D, N, K, H, F, L = 32, 64, 4, 2, 16, 192, 2  # GQA, SwiGLU, RMSNorm, untied, no biases
    layer = 2 * D * N * H + 2 * D * K * H + 3 * D * F + 2 * D  # q, out, k, v, MLP, 2 norms
    assert counts[-1] == 2 * V * D + L * layer + D == 102_720  # + embed, lm_head, final norm
    assert counts[-1] == count_params(config) == sum(counts[:-1])
    assert "decoder/layers/attention" in table and "(2, 64, 2, 16)" in table  # [L, D, K, H]


def test_cli(tmp_path, capsys):
    path = tmp_path / "m.toml"
    path.write_text('[model]\npreset = "gpt2-small"\n')
    assert main([str(path)]) == 0
    assert "124,439,808" in capsys.readouterr().out
    assert main([str(path), "model.d_model=100"]) == 2
    assert "model.d_model=100 is invalid" in capsys.readouterr().err
