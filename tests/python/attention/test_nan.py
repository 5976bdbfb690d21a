"""NaN in, NaN out on the CPU engine: one NaN element of q, k, v, bias or softmax_offset, or
a score_mod that returns NaN at one entry, in every dtype, BSHD and THD. out, softmax_aux,
max_logit and every gradient must be NaN exactly where reference.py has NaN (the spec: a
NaN among a query's kept scores makes its row NaN) and close to it elsewhere. A row that
keeps no key still gives 0 and lse -inf; a NaN at a masked position changes nothing; a
+inf softmax_offset takes all the mass (output 0, lse +inf, no gradient)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import DTYPES, assert_close, normal, reference_f32, reference_lowp
from features import THD, Spec, fused_fn, masks, reference_features
from fusedattn import AttnMaskType, QKVLayout, SequenceDescriptor, SoftmaxType
from fusedattn import score_mod as sm_mod
from fusedattn.reference import nan_max

NAN = float("nan")


def ragged():
    """Two THD rows: segments with gaps, one whose queries keep no key (row 0, tokens
    30..69: kv length 0), padding at the ends."""
    lens = (jnp.array([[20, 0, 1, 40], [96, 0, 0, 0]], jnp.int32),
            jnp.array([[25, 3, 1, 0], [60, 10, 0, 0]], jnp.int32))
    offs = (jnp.array([[0, 25, 25, 30, 70], [0, 96, 96, 96, 96]], jnp.int32),
            jnp.array([[5, 35, 38, 39, 39], [0, 60, 70, 70, 70]], jnp.int32))
    return SequenceDescriptor.from_seqlens_and_offsets(lens, offs)


def spec_of(layout, dtype, source):
    bias = source == "bias"
    softmax = SoftmaxType.LEARNABLE_SOFTMAX if source == "offset" else SoftmaxType.VANILLA_SOFTMAX
    if layout == "bshd":  # Sq = 70 > 64: two query tiles; causal keeps keys j <= i
        return Spec(dtype=dtype, mask=AttnMaskType.CAUSAL_MASK, B=2, Sq=70, Skv=80, Hq=4, Hkv=2,
                    D=16, bias_shape=(2, 4, 70, 80) if bias else None, softmax=softmax)
    return Spec(dtype=dtype, layout=QKVLayout.THD_THD_THD, mask=AttnMaskType.PADDING_MASK, B=2,
                Sq=96, Skv=96, Hq=4, Hkv=2, D=16, sd=ragged(), M=4,
                bias_shape=(2, 4, 96, 96) if bias else None, softmax=softmax)


# Where the NaN goes: (q, k, v index [b, token, head, d]; bias [b, h, i, j]; offset [h]),
# each at a kept position (BSHD: key <= query; THD: inside a segment that keeps keys).
# v's key is kept by every query of its tiles: P @ V meets a NaN v element also in rows
# that do not keep its key (0 * NaN, in the reference everywhere, in the engine in the
# tiles that hold it), and their gradients then differ (the engine's dO.O sees it).
PLACES = {
    "bshd": dict(q=(1, 66, 3, 5), k=(0, 10, 1, 3), v=(1, 0, 0, 3), bias=(0, 2, 30, 7), offset=2),
    "thd": dict(q=(1, 50, 1, 2), k=(0, 12, 0, 1), v=(1, 20, 1, 0), bias=(0, 2, 10, 8), offset=1),
}


def nan_at_5_3(s, b, h, q, k):  # query 5 keeps key 3 under the causal mask too
    return jnp.where((q == 5) & (k == 3), jnp.nan, s)


def plus_nan_at_5_3(s, b, h, q, k):  # a derivative of 1 there: the gradient is NaN too
    return s + jnp.where((q == 5) & (k == 3), jnp.nan, 0.0)


def make_inputs(key, spec):
    ks = jax.random.split(key, 6)
    q = normal(ks[0], (spec.B, spec.Sq, spec.Hq, spec.D), spec.dtype)
    k = normal(ks[1], (spec.B, spec.Skv, spec.Hkv, spec.D), spec.dtype)
    v = normal(ks[2], (spec.B, spec.Skv, spec.Hkv, spec.dv), spec.dtype)
    bias = None if spec.bias_shape is None else normal(ks[3], spec.bias_shape, spec.dtype)
    offset = normal(ks[4], (spec.Hq,)) if spec.softmax == SoftmaxType.LEARNABLE_SOFTMAX else None
    dout = normal(ks[5], (spec.B, spec.Sq, spec.Hq, spec.dv), spec.dtype)
    return [q, k, v, bias, offset], dout


def run(spec, args, dout, score_mod=None, with_grads=True):
    """Fused (out, lse [B, Hq, Sq], max_logit [Hq], grads) and the same from the float32
    reference and the low-precision one (out, grads), all numpy float32."""
    extra = {} if score_mod is None else dict(score_mod=score_mod)
    f = fused_fn(spec, **extra)
    thd = spec.layout in THD
    sm_fn = None
    if score_mod is not None:
        m, arrays4 = sm_mod.make_score_mod(score_mod, (), None, (spec.B, spec.Hq, spec.Sq, spec.Skv))
        sm_fn = lambda s, qp, kp: sm_mod.apply_reference(m.fn, s, arrays4, *((qp, kp) if thd else ()))

    def ref(q, k, v, bias, offset):
        feats = reference_features(spec, bias, offset)
        ql, kl, scale = feats.pop("q_lens"), feats.pop("kv_lens"), feats.pop("scale")
        return reference_f32(q, k, v, spec.mask, ql, kl, scale, score_mod=sm_fn, **feats)

    def lowp(q, k, v, bias, offset):
        feats = reference_features(spec, bias, offset)
        ql, kl, scale = feats.pop("q_lens"), feats.pop("kv_lens"), feats.pop("scale")
        return reference_lowp(q, k, v, spec.mask, ql, kl, scale, **feats)

    argnums = tuple(i for i, x in enumerate(args) if x is not None)
    f32 = lambda x: None if x is None else x.astype(jnp.float32)
    dout32 = f32(dout)

    @jax.jit
    def go(*args):
        out, aux = f(*args)
        r_out, r_lse, r_max = ref(*args)
        res = dict(out=(out, r_out), lse=(aux["softmax_aux"][..., 0], r_lse),
                   max_logit=(aux["max_logit"], nan_max(r_max, axis=0)), grads=((), ()))
        if with_grads:
            fg = jax.grad(lambda *a: jnp.sum(f(*a)[0].astype(jnp.float32) * dout32),
                          argnums)(*args)
            rg = jax.grad(lambda *a: jnp.sum(ref(*a)[0] * dout32), argnums)(
                *map(f32, args[:4]), args[4])
            res["grads"] = (fg, rg)
        if sm_fn is None:  # reference_lowp has no score_mod: the tolerance then is float32's
            res["lowp"] = lowp(*args)
            if with_grads:
                res["lowp_g"] = jax.grad(
                    lambda *a: jnp.sum(lowp(*a).astype(jnp.float32) * dout32), argnums)(*args)
        return res

    r = go(*args)
    np32 = lambda x: np.asarray(jnp.asarray(x, jnp.float32))
    out = {k: tuple(map(np32, r[k])) for k in ("out", "lse", "max_logit")}
    if thd:
        out["lse"] = (np.swapaxes(out["lse"][0], 1, 2), out["lse"][1])
    names = [("dq", "dk", "dv", "dbias", "dsoftmax_offset")[i] for i in argnums]
    grads = {n: (np32(a), np32(b)) for n, a, b in zip(names, *r["grads"])}
    lowp_out = np32(r["lowp"]) if "lowp" in r else None
    lowp_g = dict(zip(names, map(np32, r["lowp_g"]))) if "lowp_g" in r else {}
    return out, grads, lowp_out, lowp_g


def assert_same_nan(name, got, ref, lowp=None, dtype=jnp.float32, loose=None):
    """NaN exactly where ref has NaN, the same infinities, and close elsewhere. loose (bool,
    got's shape): where the reference's NaN is the 0 * NaN of a matmul at a masked score
    (the engine has it only in the tiles it visits): got may be NaN there or not."""
    assert got.shape == ref.shape, f"{name}: shape {got.shape}, expected {ref.shape}"
    nan, got_nan = np.isnan(ref), np.isnan(got)
    extra = np.argwhere(got_nan & ~nan)
    assert not extra.size, f"{name}: NaN where the reference is finite, at {extra[:4].tolist()}"
    loose = np.zeros(got.shape, bool) if loose is None else loose
    np.testing.assert_array_equal(got_nan[~loose], nan[~loose], err_msg=f"{name}: NaN pattern "
                                  f"({int(got_nan.sum())} NaN, reference {int(nan.sum())})")
    for inf in (np.isposinf, np.isneginf):
        np.testing.assert_array_equal(inf(got), inf(ref), err_msg=f"{name}: {inf.__name__}")
    fin = np.isfinite(ref) & np.isfinite(got)
    if lowp is None and jnp.dtype(dtype) != jnp.float32:  # score_mod: no low-precision baseline
        bound = {jnp.dtype(jnp.bfloat16): 3e-2, jnp.dtype(jnp.float16): 4e-3}[jnp.dtype(dtype)]
        scale = max(1.0, float(np.abs(ref[fin]).max(initial=0.0)))
        err = float(np.abs(got[fin] - ref[fin]).max(initial=0.0))
        assert err <= bound * scale, f"{name}: max |err| {err:.3g} > {bound * scale:.3g}"
    else:
        assert_close(name, got[fin], ref[fin], None if lowp is None else lowp[fin],
                     dtype=jnp.float32 if lowp is None else dtype)
    return nan


def loose_of(spec, source, name, g):
    """A NaN q element (b, i, h, d) meets every key's dS in dK = dS^T Q, masked ones (dS 0)
    too: column d of dk may be NaN at keys row i does not keep; likewise a NaN k element
    in column d of dq."""
    loose = np.zeros(g.shape, bool)
    layout = "thd" if spec.layout in THD else "bshd"
    group = spec.Hq // spec.Hkv
    if source == "q" and name == "dk":
        b, _, h, d = PLACES[layout]["q"]
        loose[b, :, h // group, d] = True
    if source == "k" and name == "dq":
        b, _, hk, d = PLACES[layout]["k"]
        loose[b, :, hk * group:(hk + 1) * group, d] = True
    return loose


def check_case(key, layout, dtype, source, poison=True, with_grads=True):
    """Runs one case; poison: the NaN must reach the outputs (else: must not)."""
    spec = spec_of(layout, dtype, source)
    args, dout = make_inputs(key, spec)
    score_mod = None
    if source in SCORE_MODS:
        score_mod = SCORE_MODS[source]
    elif source == "offset":
        args[4] = args[4].at[PLACES[layout]["offset"]].set(NAN)
    elif source is not None:
        i = ("q", "k", "v", "bias").index(source)
        args[i] = args[i].at[PLACES[layout][source]].set(NAN)
    out, grads, lowp_out, lowp_g = run(spec, args, dout, score_mod, with_grads)
    nan_out = assert_same_nan("out", *out["out"], lowp_out, dtype)
    assert_same_nan("softmax_aux", *out["lse"])
    assert_same_nan("max_logit", *out["max_logit"])
    for name, (g, rg) in grads.items():
        assert_same_nan(name, g, rg, lowp_g.get(name), dtype, loose_of(spec, source, name, g))
    assert nan_out.any() == poison, f"the reference's out has {int(nan_out.sum())} NaN"
    if not poison:
        assert not np.isnan(out["out"][0]).any()
    # Rows that keep no key: output 0, lse -inf, NaN or not.
    keep, real = masks(spec)
    empty = ~keep.any(axis=2)
    assert not out["out"][0][empty].any(), "rows that keep no key must give 0"
    if spec.softmax == SoftmaxType.VANILLA_SOFTMAX:
        assert np.isneginf(out["lse"][0].transpose(0, 2, 1)[empty]).all()
    return out, grads


SCORE_MODS = {"score_mod": nan_at_5_3, "score_mod_plus": plus_nan_at_5_3}
SOURCES = ["q", "k", "v", "bias", "offset", *SCORE_MODS]


@pytest.mark.parametrize("layout", ["bshd", "thd"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("source", SOURCES)
def test_nan_propagates(key, source, dtype, layout):
    out, grads = check_case(key, layout, dtype, source)
    o, lse = out["out"][0], out["lse"][0]
    if source != "v":  # a NaN score or sink: NaN rows
        assert np.isnan(lse).any() and np.isnan(grads["dq"][0]).any()
        assert np.isnan(grads["dk"][0]).any()
        # max_logit: the max of the kept scores, the sink not among them
        assert np.isnan(out["max_logit"][0]).any() == (source != "offset")
    else:  # v: NaN outputs and gradients, finite statistics
        assert np.isnan(o).any() and not np.isnan(lse).any()
        assert not np.isnan(out["max_logit"][0]).any()


def test_nan_rows_are_whole_rows(key):
    # q NaN at one element of row 66, head 3: exactly that row is NaN, in out and lse.
    out, grads = check_case(key, "bshd", jnp.float32, "q")
    o, lse = out["out"][0], out["lse"][0]
    nan_rows = np.argwhere(np.isnan(o).any(-1))
    np.testing.assert_array_equal(nan_rows, [[1, 66, 3]])
    assert np.isnan(o[1, 66, 3]).all()
    np.testing.assert_array_equal(np.argwhere(np.isnan(lse)), [[1, 3, 66]])
    assert np.isnan(out["max_logit"][0]).tolist() == [False, False, False, True]
    assert np.isnan(grads["dq"][0][1, 66, 3]).all()


@pytest.mark.parametrize("layout, source, place", [
    ("bshd", "k", (0, 75, 1, 3)),      # key 75: past every query of the causal mask
    ("bshd", "bias", (1, 0, 5, 60)),   # a masked (i < j) bias entry
    ("thd", "q", (0, 22, 2, 0)),       # a padding token between two segments
    ("thd", "q", (0, 35, 2, 0)),       # a query of a segment that has no keys
    ("thd", "k", (0, 32, 1, 0)),       # a key of that segment's gap: no query keeps it
])
def test_nan_at_masked_positions_changes_nothing(key, layout, source, place, monkeypatch):
    # The forward only, but for a bias (element-wise): the gradients' matmuls multiply
    # a masked NaN q or k element by a zero dS (0 * NaN), in the reference everywhere
    # and in the engine's tiles that hold it, so there the rule is not defined. A NaN
    # of v at a masked key is likewise undefined (the reference's probs @ v is NaN).
    monkeypatch.setitem(PLACES[layout], source, place)
    out, grads = check_case(key, layout, jnp.float32, source, poison=False,
                            with_grads=source == "bias")
    assert not any(np.isnan(a).any() for a, _ in out.values())
    assert not any(np.isnan(g).any() for g, _ in grads.values())


@pytest.mark.parametrize("layout", ["bshd", "thd"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_infinite_softmax_offset(key, layout, dtype):
    # softmax_offset +inf on head 1 takes all that head's mass: output exactly 0, lse
    # +inf on its real rows, no gradient; -inf on head 2 is no extra logit at all.
    spec = spec_of(layout, dtype, "offset")
    args, dout = make_inputs(key, spec)
    args[4] = args[4].at[1].set(jnp.inf).at[2].set(-jnp.inf)
    out, grads, lowp_out, lowp_g = run(spec, args, dout)
    assert_same_nan("out", *out["out"], lowp_out, dtype)
    assert_same_nan("softmax_aux", *out["lse"])
    assert_same_nan("max_logit", *out["max_logit"])
    for name, (g, rg) in grads.items():
        assert not np.isnan(g).any(), name
        assert_same_nan(name, g, rg, lowp_g.get(name), dtype)
    o, lse = out["out"][0], out["lse"][0]
    _, real = masks(spec)
    assert not o[:, :, 1].any()
    assert np.isposinf(lse[:, 1][real]).all() and not np.isposinf(lse[:, [0, 2, 3]]).any()
    assert not grads["dq"][0][:, :, 1].any()
    assert grads["dsoftmax_offset"][0][1] == 0.0
