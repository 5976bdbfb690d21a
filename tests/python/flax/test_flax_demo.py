"""python -m fusedattn demo (scripts/demo.sh's main job) with a tiny setting: it trains,
prints the progress bar, tokens/s, per-head max_logit and the jax.nn.dot_product_attention
comparison (whose loss on the same parameters must equal fusedattn's), writes the PNG (or
says matplotlib is missing) and samples; and over a dp x tp x cp mesh (context parallelism
in every attention layer) its loss follows the one-device run step by step."""

from __future__ import annotations

import os
import re

import numpy as np

from fusedattn import demo

TINY = ["--batch", "8", "--seq", "32", "--layers", "1", "--d-model", "32", "--heads", "2",
        "--log-every", "1", "--max-val-loss", "inf"]


def losses(out: str) -> list[float]:
    """The loss of every step, from the \\r-updated progress lines."""
    found = dict(re.findall(r"step (\d+)/\d+ \| loss ([0-9.]+)", out))
    return [float(found[k]) for k in sorted(found, key=int)]


def test_demo_tiny_run_and_sharded(capsys, tmp_path):
    common = TINY + ["--steps", "3", "--out", str(tmp_path)]
    assert demo.main(common + ["--compare-steps", "1", "--sample-chars", "6"]) == 0
    out = capsys.readouterr().out
    plain = losses(out)
    assert len(plain) == 3
    assert "[########################] step 3/3" in out and "tok/s" in out
    assert re.search(r"max_logit L0 \[\d+\.\d \d+\.\d\]", out)
    fused, jax_loss = map(float, re.search(
        r"loss on one batch fusedattn ([0-9.]+) \| jax.nn.dot_product_attention ([0-9.]+)",
        out).groups())
    np.testing.assert_allclose(fused, jax_loss, rtol=1e-5)
    assert "fusedattn / jax" in out
    sample = out.split("sample (KV-cache decoding, temperature 0.8):\n")[1].split("\n")[0]
    assert sample.startswith("The ") and len(sample) >= len("The ") + 1
    png = os.path.join(tmp_path, "demo.png")
    assert os.path.exists(png) or "matplotlib is not installed" in out

    # The same run over a dp x tp x cp mesh follows it step by step.
    assert demo.main(common + ["--compare-steps", "0", "--sample-chars", "1",
                               "--mesh", "dp=2,tp=2,cp=2"]) == 0
    out = capsys.readouterr().out
    assert "mesh {'dp': 2, 'cp': 2, 'tp': 2}" in out and "ms/step" in out
    sharded = losses(out)
    assert len(sharded) == 3
    np.testing.assert_allclose(sharded, plain, rtol=1e-4)
