"""python -m fusedattn: the help lists every command and benchmark, and a tiny bench run
prints its summary line and writes its JSON (and its PNG when matplotlib is there)."""

import importlib
import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import fusedattn
from fusedattn import __main__ as cli
from fusedattn import bench
from fusedattn.bench import report


def _package_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(fusedattn.__file__)))


@pytest.mark.parametrize("argv", [[], ["-h"], ["--help"]])
def test_help_exits_0_and_lists_everything(argv):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [_package_root()] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    res = subprocess.run([sys.executable, "-m", "fusedattn", *argv], capture_output=True,
                         text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    for name in list(cli.COMMANDS) + list(bench.BENCHMARKS):
        assert f"\n  {name} " in res.stdout, (name, res.stdout)


def test_unknown_command_and_benchmark_exit_2(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
    assert cli.main(["bench", "frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark 'frobnicate'" in err and "cp_ring" in err


def test_bench_help_lists_every_benchmark(capsys):
    assert cli.main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    for name in bench.BENCHMARKS:
        assert f"\n  {name} " in out


def test_every_listed_benchmark_is_a_module_with_a_main():
    for name in bench.BENCHMARKS:
        module = importlib.import_module(f"fusedattn.bench.{name}")
        assert callable(module.main)
        assert module.__doc__.startswith(f"python -m fusedattn bench {name}")


def test_summary_is_the_geomean_of_each_ratio():
    rows = [dict(a=2.0, b=0.5), dict(a=8.0), dict(a=float("nan"), b=2.0), dict(c=1.0)]
    s = report.summarize(rows, {"A": "a", "B": "b", "missing": "zzz"})
    assert set(s) == {"A", "B"}
    assert s["A"]["geomean"] == pytest.approx(4.0) and s["A"]["rows"] == 2
    assert s["B"]["geomean"] == pytest.approx(1.0) and (s["B"]["min"], s["B"]["max"]) == (0.5, 2.0)
    line = report.summary_line(s)
    assert line.startswith("summary: A geomean 4.00x over 2 rows") and "\n" not in line
    assert "no ratio" in report.summary_line({})


def test_tiny_attention_bench_writes_json_png_and_summary(tmp_path, capsys):
    argv = ["attention", "--seqlens", "32", "--dtypes", "float32", "--heads", "2",
            "--head-dim", "16", "--modes", "fwd", "--repeats", "1", "--out-dir", str(tmp_path)]
    assert cli.main(["bench"] + argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("summary: fusedattn vs jax xla geomean "), lines[-3:]
    data = json.loads((tmp_path / "bench-attention.json").read_text())
    ratios = [r["speedup_vs_xla"] for r in data["rows"]]
    assert len(ratios) == 2 and all(r > 0 for r in ratios)  # causal and not
    s = data["summary"]["fusedattn vs jax xla"]
    assert s["geomean"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 2))
    assert f"{s['geomean']:.2f}x over 2 rows" in lines[-1]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert any(l.startswith("plot: skipped (matplotlib is not installed") for l in lines)
        assert not (tmp_path / "bench-attention.png").exists()
    else:
        png = (tmp_path / "bench-attention.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_path_puts_the_png_beside_it(tmp_path, capsys):
    path = tmp_path / "sub" / "r.json"
    assert bench.main(["attention", "--seqlens", "32", "--dtypes", "float32", "--heads", "1",
                       "--head-dim", "8", "--modes", "fwd", "--repeats", "1", "--json",
                       str(path), "--no-plot", "--out-dir", str(tmp_path / "unused")]) == 0
    out = capsys.readouterr().out
    assert path.exists() and not (tmp_path / "unused").exists() and "plot:" not in out


def _has_gpu():
    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


@pytest.mark.skipif(_has_gpu(), reason="with a GPU the fallback bench runs its full GPU grid")
def test_tiny_fallback_bench_names_each_rows_backend(tmp_path, capsys):
    argv = ["fallback", "--kinds", "f32", "alibi", "softcap", "--modes", "fwd", "--repeats", "1",
            "--cpu-divisor", "64", "--out-dir", str(tmp_path), "--no-plot"]
    assert cli.main(["bench"] + argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("summary: fusedattn vs the old fallback (reference.py) geomean")
    rows = json.loads((tmp_path / "bench-fallback.json").read_text())["rows"]
    assert [r["kind"] for r in rows] == ["f32", "alibi", "softcap"]
    for r in rows:
        assert r["backend"] == "cpu_flash" and r["ratio_reference"] > 0 and r["ratio_jax_xla"] > 0


def test_tiny_dense_mask_bench(tmp_path, capsys):
    argv = ["dense_mask", "--seq", "128", "--window", "16", "--repeats", "1",
            "--out-dir", str(tmp_path), "--no-plot"]
    assert cli.main(["bench"] + argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("summary: typed mask / dense mask geomean")
    rows = json.loads((tmp_path / "bench-dense_mask.json").read_text())["rows"]
    assert [(r["kind"], r["mode"]) for r in rows] == [
        ("causal", "fwd"), ("causal", "fwd+bwd"), ("window", "fwd"), ("window", "fwd+bwd")]
    for r in rows:
        assert r["ratio_typed"] > 0 and r["ratio_jax"] > 0


def test_dense_mask_bench_padding_kind(tmp_path, capsys):
    # a 2-D padding mask whose padded queries keep nothing (the engine averages the values there)
    from fusedattn.bench.dense_mask import _lengths, _mask
    m = np.asarray(_mask("padding", 16, 4, 2))
    assert m.shape == (2, 1, 16, 16) and not m[1, 0, 12:].any() and m[0, 0, 15].all()
    assert list(np.asarray(_lengths(2, 16))) == [16, 12]
    argv = ["dense_mask", "--kinds", "padding", "--modes", "fwd", "--seq", "64", "--batch", "2",
            "--repeats", "1", "--out-dir", str(tmp_path), "--no-plot"]
    assert cli.main(["bench"] + argv) == 0
    rows = json.loads((tmp_path / "bench-dense_mask.json").read_text())["rows"]
    assert [(r["kind"], r["mode"]) for r in rows] == [("padding", "fwd")]


def test_deterministic_bench_needs_a_gpu(capsys):
    """On the CPU the engine is deterministic in either mode: the benchmark says so, exit 2
    (its GPU run: bench/RESULTS.md)."""
    if jax.default_backend() == "gpu":
        pytest.skip("runs the benchmark on a GPU")
    assert cli.main(["bench", "deterministic", "--head-dims", "64"]) == 2
    assert "needs a GPU" in capsys.readouterr().out


@pytest.mark.skipif(_has_gpu(), reason="with a GPU the score_mod bench runs its GPU grid")
def test_tiny_score_mod_bench_takes_head_dims_and_seqlens(tmp_path, capsys):
    argv = ["score_mod", "--head-dims", "16", "32", "--seqlens", "32", "--modes", "fwd+bwd",
            "--repeats", "1", "--xla-max-seq", "0", "--out-dir", str(tmp_path), "--no-plot"]
    assert cli.main(["bench"] + argv) == 0
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "bench-score_mod.json").read_text())["rows"]
    assert [(r["D"], r["S"], r["mode"]) for r in rows] == [(16, 32, "fwd+bwd"), (32, 32, "fwd+bwd")]
    for r in rows:  # the CPU engine both ways: no Hopper kernel, so no cuDNN-backward anchor
        assert r["softcap_backend"] == r["alibi_backend"] == "cpu_flash"
        assert not r["softcap_hopper_bwd"] and "softcap_cudnn_bwd_ms" not in r
        assert r["softcap_ms"] > 0 and r["alibi_vs_plain"] > 0
    assert "D  16 S     32" in out and "summary: softcap vs plain fused_attn geomean" in out
