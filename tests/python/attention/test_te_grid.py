"""TransformerEngine's attention test grid (te_grid.py: TE's tests/jax/test_fused_attn.py
with its call forms unchanged), a deterministic sample of it: every layout x mask x bias
type TE runs, the other axes (shapes, dropout, windows, descriptor formats, softmax types)
drawn across them, and test_forward's other bias shapes. dev/te_grid/run_grid.py runs the
whole grid through the same code."""

import collections

import pytest

import te_grid

SAMPLE = te_grid.ci_sample()


def test_the_sample_covers_every_axis():
    seen = collections.defaultdict(set)
    for c in SAMPLE:
        for axis in ("qkv_layout", "attn_mask_type", "shape", "dropout_prob", "swa",
                     "seq_desc_format", "softmax_type", "bias_shape", "is_training", "test"):
            seen[axis].add(getattr(c, axis))
    assert seen["qkv_layout"] == set(te_grid.LAYOUTS)
    assert seen["attn_mask_type"] == set(te_grid.MASKS)
    assert seen["shape"] == set(te_grid.SHAPES)
    assert seen["seq_desc_format"] == set(te_grid.FORMATS)
    assert seen["softmax_type"] == set(te_grid.SOFTMAX)
    assert seen["bias_shape"] == {None} | set(te_grid.BiasShape)
    for axis, values in (("dropout_prob", te_grid.DROPOUTS), ("swa", te_grid.SWA),
                         ("is_training", [True, False]), ("test", ["backward", "forward"])):
        assert seen[axis] == set(values), axis
    assert 40 <= len(SAMPLE) <= 80 and all(te_grid.te_skip(c) is None for c in SAMPLE)


@pytest.mark.parametrize("case", SAMPLE, ids=lambda c: c.id)
def test_te_grid_case(case):
    status, detail = te_grid.outcome(case)
    assert status in ("passed", "uncompared"), f"{status}: {detail}"
    if case.dropout_prob == 0.0 or (case.test == "forward" and not case.is_training):
        assert status == "passed"  # compared with TE's reference
