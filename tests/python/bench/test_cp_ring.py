"""bench cp_ring: the ring schedule (pure), its figures, and one tiny timed run on the CPU."""

import json

import numpy as np
import pytest

from fusedattn.bench import cp_ring
from fusedattn.bench.cp_ring import VARIANTS, Block, ring_stats, schedule


def _tokens(chunks):
    return np.concatenate([np.arange(s, s + n) for s, n in chunks])


def _work(b: Block) -> float:
    """(query, key) pairs the call computes."""
    sq, skv, causal = b.shape
    return sq * (sq + 1) / 2 if causal else sq * skv


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("cp", [2, 4, 8])
def test_every_kept_pair_computed_once_by_its_owner(variant, cp):
    S = 16 * cp
    chunks = cp_ring.rank_chunks(S, cp, variant)
    count = np.zeros((S, S), int)
    for r, steps in enumerate(schedule(S, cp, variant)):
        assert len(steps) == cp
        for s, blocks in enumerate(steps):
            mine, theirs = set(_tokens(chunks[r])), set(_tokens(chunks[(r - s) % cp]))
            for b in blocks:
                q, kv = _tokens(b.q), _tokens(b.kv)
                assert set(q) <= mine and set(kv) <= theirs, (r, s, b)
                keep = kv[None, :] <= q[:, None] if b.causal else np.ones((len(q), len(kv)), bool)
                if b.causal:  # the causal mask on the concatenation is exact
                    assert (np.tril(np.ones((len(q), len(kv)), bool)) == keep).all(), b
                count[np.ix_(q, kv)] += keep
    expect = np.ones((S, S), int) if variant == "full" else np.tril(np.ones((S, S), int))
    np.testing.assert_array_equal(count, expect)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_dual_chunk_calls_and_equal_load(cp):
    S, C = 64 * cp, 32
    for r, steps in enumerate(schedule(S, cp, "dual")):
        assert sorted(b.shape for b in steps[0]) == [(C, C, False), (C, C, True), (C, C, True)]
        for blocks in steps[1:]:
            assert [b.shape for b in blocks] == [(C, C, False)] * 2
    for r, steps in enumerate(schedule(S, cp, "dual-merged")):
        assert [b.shape for b in steps[0]] == [(2 * C, 2 * C, True)]
        for s, blocks in enumerate(steps[1:], 1):
            # the source rank (r - s) mod cp is below r exactly when s <= r
            assert [b.shape for b in blocks] == [(2 * C, C, False) if s <= r else (C, 2 * C, False)]
    for variant in ("dual", "dual-merged"):
        loads = {sum(_work(b) for blocks in steps for b in blocks)
                 for steps in schedule(S, cp, variant)}
        assert len(loads) == 1, (variant, loads)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_contiguous_causal_is_unbalanced(cp):
    S = 32 * cp
    L = S // cp
    sched = schedule(S, cp, "contig")
    for r, steps in enumerate(sched):
        assert [b.shape for b in steps[0]] == [(L, L, True)]
        for s, blocks in enumerate(steps[1:], 1):
            assert [b.shape for b in blocks] == ([(L, L, False)] if s <= r else [])
    loads = [sum(_work(b) for blocks in steps for b in blocks) for steps in sched]
    assert loads == sorted(loads) and loads[0] == L * (L + 1) / 2
    assert loads[-1] == (cp - 1) * L * L + L * (L + 1) / 2


def test_ring_stats():
    # rank 0 takes 1, 1; rank 1 takes 3, 1: steps wait for the slowest rank (3, 1)
    st = ring_stats([[1.0, 1.0], [3.0, 1.0]], comm_s=2.0)
    assert st["simulated_s"] == 4.0 and st["ideal_s"] == 3.0
    assert st["efficiency"] == 0.75 and st["balance"] == 0.5
    assert st["min_step_s"] == 3.0 and st["fits"]  # the last step sends nothing
    assert ring_stats([[1.0, 1.0], [1.0, 1.0]], comm_s=2.0)["with_comm_s"] == 3.0
    assert not ring_stats([[1.0, 1.0], [1.0, 1.0]], comm_s=2.0)["fits"]
    assert cp_ring.kv_bytes(4096, 4, 16, 128) == 2 * 1024 * 16 * 128 * 2


def test_tiny_run_writes_json(tmp_path):
    out = tmp_path / "cp.json"
    assert cp_ring.main(["--seqlens", "128", "--cp", "2", "--heads", "1", "--head-dim", "32",
                         "--variants", "dual", "contig", "--repeats", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(r["variant"], r["mode"]) for r in rows} == {
        (v, m) for v in ("dual", "contig") for m in ("fwd", "fwd+bwd")}
    for r in rows:
        assert 0 < r["efficiency"] <= 1 + 1e-9 and r["simulated_ms"] > 0 and r["speedup"] > 0
        assert r["balance"] == pytest.approx(1.0) if r["variant"] == "dual" else r["balance"] < 1
