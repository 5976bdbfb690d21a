"""fusedattn.dot_product_attention against jax.nn.dot_product_attention(implementation="xla"):
the same signature, and the same cases through both give the same outputs, residuals and
gradients (fully masked rows included, where jax averages all values)."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from conftest import normal

B, T, S, N, K, H = 2, 40, 56, 4, 2, 32


def inputs(key, dtype, T=T, S=S, N=N, K=K, H=H):
    ks = jax.random.split(key, 4)
    return (normal(ks[0], (B, T, N, H), dtype), normal(ks[1], (B, S, K, H), dtype),
            normal(ks[2], (B, S, K, H), dtype), normal(ks[3], (B, T, N, H), dtype))


def _bias(shape, dtype=jnp.float32):
    return lambda key: normal(key, shape, dtype)


def _mask(shape, rate=0.7, dead_row=True):
    def make(key):
        m = jax.random.bernoulli(key, rate, shape)
        return m.at[0, 0, 3].set(False) if dead_row else m  # one row keeps nothing
    return make


QL = jnp.array([T - 7, T], jnp.int32)
KVL = jnp.array([0, 31], jnp.int32)  # batch 0 keeps no key at all
# name -> (keyword arguments, makers of array arguments by name)
CASES = {
    "plain": ({}, {}),
    "causal": (dict(is_causal=True), {}),
    "scale": (dict(scale=0.3, is_causal=True), {}),
    "bias_full": ({}, dict(bias=_bias((B, N, T, S)))),
    "bias_broadcast_rows": ({}, dict(bias=_bias((1, N, 1, S)))),
    "bias_one_head": (dict(is_causal=True), dict(bias=_bias((B, 1, T, S)))),
    "mask": ({}, dict(mask=_mask((B, 1, T, S)))),
    "mask_and_bias": ({}, dict(mask=_mask((1, N, T, S)), bias=_bias((B, 1, T, S)))),
    "q_lengths": (dict(query_seq_lengths=QL), {}),
    "kv_lengths_causal": (dict(key_value_seq_lengths=KVL, is_causal=True), {}),
    "both_lengths": (dict(query_seq_lengths=QL, key_value_seq_lengths=KVL), {}),
    "window": (dict(local_window_size=(5, 3)), {}),
    "window_int": (dict(local_window_size=4), {}),
    "window_causal_lengths": (dict(local_window_size=(3, 0), is_causal=True,
                                   key_value_seq_lengths=jnp.array([8, S], jnp.int32)), {}),
    "window_negative": (dict(local_window_size=(6, -2)), {}),
    "everything": (dict(is_causal=True, query_seq_lengths=QL,
                        key_value_seq_lengths=jnp.array([5, S], jnp.int32),
                        local_window_size=(12, 0)),
                   dict(mask=_mask((B, N, T, S)), bias=_bias((1, N, T, S)))),
}


def _grid():
    for i, name in enumerate(CASES):
        dtype = jnp.bfloat16 if i % 2 else jnp.float32
        yield pytest.param(name, dtype, id=f"{name}-{jnp.dtype(dtype).name}")
    # float16: jax's xla implementation asks dot_general for F16_F16_F32, which the CPU
    # lacks; it runs on the float16 inputs widened to float32, its results rounded back.
    for name in ("causal", "mask_and_bias", "both_lengths", "window_negative", "everything"):
        yield pytest.param(name, jnp.float16, id=f"{name}-float16")


def _tol(dtype):
    # Two implementations of the same math: float32 agrees to rounding; in bfloat16 both
    # round the matmul inputs and probabilities, and land within 2 units of roundoff of
    # the largest element of each other (measured: at most one).
    if dtype == jnp.float32:
        return dict(rtol=2e-5, atol=2e-5)
    if dtype == jnp.float16:  # both round float32 math once: a few units of roundoff
        return dict(rtol=0.0, atol=4 * 2.0 ** -10)
    return dict(rtol=0.0, atol=2 * 2.0 ** -7)


@pytest.mark.parametrize("name, dtype", list(_grid()))
def test_same_results_as_jax(key, name, dtype):
    kwargs, makers = CASES[name]
    q, k, v, dout = inputs(key, dtype)
    arrays = {a: make(jax.random.fold_in(key, i)) for i, (a, make) in enumerate(makers.items())}
    if "bias" in arrays:
        arrays["bias"] = arrays["bias"].astype(dtype)  # fusedattn rounds the bias to q's dtype

    def run(f):
        def loss(q, k, v):
            return jnp.sum(f(q, k, v, **arrays, **kwargs).astype(jnp.float32) *
                           dout.astype(jnp.float32))
        out, res = f(q, k, v, **arrays, **kwargs, return_residual=True)
        return out, res, jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    ours = jax.jit(lambda q, k, v: run(fusedattn.dot_product_attention))(q, k, v)
    def jax_xla(*a, **kw):
        if dtype != jnp.float16:
            return jax.nn.dot_product_attention(*a, **kw, implementation="xla")
        wide = [x.astype(jnp.float32) for x in a]
        kw = {n: x.astype(jnp.float32) if n == "bias" else x for n, x in kw.items()}
        return jax.tree.map(lambda x: x.astype(dtype), jax.nn.dot_product_attention(
            *wide, **kw, implementation="xla"))

    theirs = jax.jit(lambda q, k, v: run(jax_xla))(q, k, v)
    tol = _tol(dtype)
    names = ("out", "residual", "dq", "dk", "dv")
    for what, a, b in zip(names, jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        assert a.shape == b.shape and a.dtype == b.dtype, (what, a.shape, b.shape, a.dtype, b.dtype)
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert not np.isnan(a).any(), what
        scale = max(1.0, float(np.abs(b[np.isfinite(b)]).max())) if what != "residual" else 1.0
        if what == "residual":  # large negative stand-ins compare by relative size
            np.testing.assert_allclose(a, b, rtol=max(tol["rtol"], tol["atol"] / 2), atol=tol["atol"],
                                       err_msg=what)
        else:
            np.testing.assert_allclose(a / scale, b / scale, **tol, err_msg=what)


def test_three_dimensional_inputs(key):
    q, k, v, _ = inputs(key, jnp.float32)
    q, k, v = q[0], k[0], v[0]
    ours, res = fusedattn.dot_product_attention(q, k, v, is_causal=True, return_residual=True)
    theirs, res_j = jax.nn.dot_product_attention(q, k, v, is_causal=True, return_residual=True)
    assert ours.shape == q.shape and res.shape == res_j.shape == (T, N)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(res), np.asarray(res_j), rtol=2e-5, atol=2e-5)


def test_signature_is_jax_s():
    ours = inspect.signature(fusedattn.dot_product_attention).parameters
    theirs = inspect.signature(jax.nn.dot_product_attention).parameters
    assert list(ours) == list(theirs)
    for name in ours:
        assert ours[name].kind == theirs[name].kind, name
        assert ours[name].default == theirs[name].default, name


def test_implementation_option(key):
    q, k, v, _ = inputs(key, jnp.float32)
    xla = fusedattn.dot_product_attention(q, k, v, implementation="xla")
    np.testing.assert_array_equal(np.asarray(xla),
                                  np.asarray(jax.nn.dot_product_attention(q, k, v,
                                                                          implementation="xla")))
    with pytest.raises(ValueError, match="Unsupported implementation option: triton"):
        fusedattn.dot_product_attention(q, k, v, implementation="triton")


def test_calls_the_engine(key):
    q, k, v, _ = inputs(key, jnp.float32)
    text = jax.jit(fusedattn.dot_product_attention).lower(q, k, v).as_text()
    assert "fusedattn_attn_fwd" in text


@pytest.mark.parametrize("args, message", [
    (dict(value=(B, S, K, H + 1)), "value shape should be"),
    (dict(query=(B, T, N, H + 2)), "query shape should be"),
    (dict(query=(B, T, 3, H)), "multiple of key/value heads"),
])
def test_same_errors_as_jax(key, args, message):
    shapes = dict(query=(B, T, N, H), key=(B, S, K, H), value=(B, S, K, H))
    shapes.update(args)
    arrays = {n: jnp.zeros(s) for n, s in shapes.items()}
    for f in (fusedattn.dot_product_attention, jax.nn.dot_product_attention):
        with pytest.raises(ValueError, match=message):
            f(arrays["query"], arrays["key"], arrays["value"])


@pytest.mark.parametrize("kwargs, message", [
    (dict(mask=jnp.ones((1, 1, T, S), jnp.int32)), "mask dtype should be bool"),
    (dict(query_seq_lengths=jnp.ones((B,), jnp.float32)), "query_seq_lengths dtype should be int32"),
    (dict(key_value_seq_lengths=jnp.ones((B + 1,), jnp.int32)), "key_value_seq_lengths shape"),
    (dict(bias=jnp.ones((1, 1, 1, T, S))), "bias ndim should be 4"),
])
def test_same_argument_errors_as_jax(kwargs, message):
    q, k = jnp.zeros((B, T, N, H)), jnp.zeros((B, S, K, H))
    for f in (fusedattn.dot_product_attention, jax.nn.dot_product_attention):
        with pytest.raises(ValueError, match=message):
            f(q, k, k, **kwargs)


# ---------------------------------------------------------------------------
# Dense masks over many key tiles: dot_product_attention tells the engine its bias is a
# folded mask (_lib.REQUEST_MASK_BIAS), and the CPU engine drops the masked keys and
# skips the 64 x 64 tiles a mask empties. Results: jax's, and the mask type's where one
# exists.

TB, SB = 200, 264  # several query and key tiles, the last ones partial


def _dense(name, T=TB, S=SB):
    i, j = np.arange(T)[:, None], np.arange(S)[None, :]
    if name == "causal":
        m = j <= i
    elif name == "window":
        m = (j >= i - 20) & (j <= i + 5)
    elif name == "padding":  # batch 1 keeps 150 keys and 180 rows; batch 0 everything
        m = np.stack([np.ones((T, S), bool), (i < 180) & (j < 150)])[:, None]
        return jnp.asarray(m)
    else:  # "holes": random keys dropped over a causal band, two rows that keep nothing
        rng = np.random.default_rng(0)
        m = (j <= i + 30) & (rng.random((T, S)) < 0.8)
        m[7] = False
        m[150] = False
    return jnp.asarray(m)[None, None]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["causal", "window", "padding", "holes"])
def test_dense_masks_over_many_tiles(key, name, dtype):
    q, k, v, dout = inputs(key, dtype, T=TB, S=SB)
    mask = _dense(name)

    def run(f, **kw):
        def loss(q, k, v):
            return jnp.sum(f(q, k, v, **kw).astype(jnp.float32) * dout.astype(jnp.float32))
        out, res = f(q, k, v, **kw, return_residual=True)
        return out, res, jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    ours = jax.jit(lambda q, k, v: run(fusedattn.dot_product_attention, mask=mask))(q, k, v)
    theirs = jax.jit(lambda q, k, v: run(
        lambda *a, **kw: jax.nn.dot_product_attention(*a, **kw, implementation="xla"),
        mask=mask))(q, k, v)
    tol = _tol(dtype)
    for what, a, b in zip(("out", "residual", "dq", "dk", "dv"), jax.tree.leaves(ours),
                          jax.tree.leaves(theirs)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert not np.isnan(a).any(), what
        scale = 1.0 if what == "residual" else max(1.0, float(np.abs(b).max()))
        rtol = max(tol["rtol"], tol["atol"] / 2) if what == "residual" else tol["rtol"]
        np.testing.assert_allclose(a / scale, b / scale, rtol=rtol, atol=tol["atol"], err_msg=what)
    if name in ("causal", "window"):  # the same engine through the mask type: float32
        # rounding apart (the backward's tasks sum dq in another order when a dbias
        # plane is shared), one unit of bfloat16's
        kw = dict(is_causal=True) if name == "causal" else dict(local_window_size=(20, 5))
        typed = jax.jit(lambda q, k, v: run(fusedattn.dot_product_attention, **kw))(q, k, v)
        ulp = 1e-6 if dtype == jnp.float32 else 2.0 ** -8
        for what, a, b in zip(("out", "residual", "dq", "dk", "dv"), jax.tree.leaves(ours),
                              jax.tree.leaves(typed)):
            a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
            np.testing.assert_allclose(a, b, rtol=ulp, atol=ulp * max(1.0, float(np.abs(b).max())),
                                       err_msg=what)


def test_dense_causal_skips_the_tiles_it_empties(key):
    # A NaN in the values of key 100 reaches every row of the tiles that are computed
    # (0 x NaN in P V), and no row of those skipped: rows 0..63 see only key tile 0 under
    # a causal mask, dense or typed alike (jax's own einsum would spread it to every row).
    q, k, v, _ = inputs(key, jnp.float32, T=TB, S=TB)
    v = v.at[:, 100].set(jnp.nan)
    dense = fusedattn.dot_product_attention(q, k, v, mask=_dense("causal", TB, TB))
    typed = fusedattn.dot_product_attention(q, k, v, is_causal=True)
    nan = np.isnan(np.asarray(dense))
    np.testing.assert_array_equal(nan, np.isnan(np.asarray(typed)))
    assert not nan[:, :64].any() and nan[:, 100:].all()
    np.testing.assert_allclose(np.asarray(dense)[~nan], np.asarray(typed)[~nan], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bias", ["zero", "random"])
@pytest.mark.parametrize("name", ["window", "holes"])
def test_dense_mask_with_a_differentiated_bias(key, name, bias):
    """The mask folded with a bias whose gradient is wanted: a zero bias leaves the mask's
    kept tiles clean (the engine adds no bias there) and dbias must still come out whole;
    a random one is added everywhere. Forward and every gradient against jax's."""
    q, k, v, dout = inputs(key, jnp.float32, T=TB, S=SB)
    mask = _dense(name)
    b = (jnp.zeros((1, 1, TB, SB)) if bias == "zero"
         else jax.random.normal(jax.random.fold_in(key, 9), (1, 1, TB, SB)))

    def grads(f):
        loss = lambda q, k, v, b: jnp.sum(f(q, k, v, bias=b, mask=mask) * dout)
        return (f(q, k, v, bias=b, mask=mask),) + jax.grad(loss, argnums=(0, 1, 2, 3))(q, k, v, b)

    ours = jax.jit(lambda: grads(fusedattn.dot_product_attention))()
    theirs = jax.jit(lambda: grads(
        lambda *a, **kw: jax.nn.dot_product_attention(*a, **kw, implementation="xla")))()
    for what, a, w in zip(("out", "dq", "dk", "dv", "dbias"), ours, theirs):
        a, w = np.asarray(a), np.asarray(w)
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(a / scale, w / scale, rtol=1e-5, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_masked_bias_value(dtype):
    # The engine's value (fa_masked_bias_value): exact in the dtype, finite, about -0.7 x
    # its largest value; float32's is jax's own masked logit.
    from fusedattn.dot_product import _LARGE_NEGATIVE, _large_negative
    v = _large_negative(dtype)
    assert np.isfinite(v) and float(jnp.asarray(v, dtype)) == v
    assert -0.71 * float(jnp.finfo(dtype).max) <= v <= -0.69 * min(float(jnp.finfo(dtype).max), 3.4e38)
    if dtype == jnp.float32:
        assert v == _LARGE_NEGATIVE


@pytest.mark.parametrize("window, causal", [((8, 2), False), ((5, 0), True)])
def test_window_rows_past_the_keys_reach_average_the_values(key, window, causal):
    # jax's window is top-left: with more queries than keys, rows past S - 1 + left keep no
    # key, and jax averages every value there; fusedattn rebuilds those rows too.
    q, k, v, dout = inputs(key, jnp.float32, T=64, S=24)
    kw = dict(local_window_size=window, is_causal=causal)

    def run(f, **extra):
        def loss(q, k, v):
            return jnp.sum(f(q, k, v, **kw, **extra) * dout)
        return f(q, k, v, **kw, **extra), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    ours = jax.jit(lambda q, k, v: run(fusedattn.dot_product_attention))(q, k, v)
    theirs = jax.jit(lambda q, k, v: run(jax.nn.dot_product_attention, implementation="xla"))(q, k, v)
    for what, a, b in zip(("out", "dq", "dk", "dv"), jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5, err_msg=what)
    assert np.abs(np.asarray(ours[0])[:, 24 + window[0]:]).max() > 0  # the averaged rows


def _flags_in(f, *args) -> list[int]:
    import re
    text = jax.jit(f).lower(*args).as_text()
    return [int(m) for m in re.findall(r"backend_flags = (-?\d+)", text)]


def test_window_that_empties_no_row_skips_the_rebuild(key):
    # Rows that keep nothing are rebuilt (jax's average of the values) by the engine, asked
    # only where they can occur: a window with T <= S + left empties none. Forward and
    # backward handlers both carry the request.
    q, k, v, _ = inputs(key, jnp.float32)
    avg = fusedattn._lib.REQUEST_AVERAGE_EMPTY_ROWS

    def grad(**kw):
        return jax.grad(lambda q, k, v: jnp.sum(
            fusedattn.dot_product_attention(q, k, v, **kw)), argnums=(0, 1, 2))

    flags = _flags_in(grad(local_window_size=(5, 3)), q, k, v)
    assert len(flags) >= 2 and not any(f & avg for f in flags), flags
    flags = _flags_in(grad(local_window_size=(5, 3), key_value_seq_lengths=KVL), q, k, v)
    assert len(flags) >= 2 and all(f & avg for f in flags), flags  # batch 0 keeps no key


def test_a_mask_alone_is_marked_keep_only(key):
    # A mask with no bias beside it folds to a bias without values: both handlers carry
    # REQUEST_MASK_KEEP_ONLY beside REQUEST_MASK_BIAS (the Hopper backward's 128-query blocks
    # at head dim 64); with a bias, a typed mask or no mask, neither handler does.
    q, k, v, _ = inputs(key, jnp.float32)
    mask = _mask((B, 1, T, S))(key)
    lib = fusedattn._lib

    def grad(**kw):
        return jax.grad(lambda q, k, v: jnp.sum(
            fusedattn.dot_product_attention(q, k, v, **kw)), argnums=(0, 1, 2))

    flags = _flags_in(grad(mask=mask), q, k, v)
    assert len(flags) >= 2 and all(f & lib.REQUEST_MASK_KEEP_ONLY and f & lib.REQUEST_MASK_BIAS
                                   for f in flags), flags
    bias = jax.random.normal(key, (1, 1, T, S), jnp.float32)
    for kw in (dict(mask=mask, bias=bias), dict(is_causal=True), dict(local_window_size=(-1, 2))):
        flags = _flags_in(grad(**kw), q, k, v)
        want = bool(kw.get("local_window_size"))  # a negative side: jax's literal dense mask
        assert len(flags) >= 2 and all(bool(f & lib.REQUEST_MASK_KEEP_ONLY) == want
                                       for f in flags), (kw, flags)


def test_a_mask_alone_reaches_the_engine_as_booleans(key):
    # A mask with no bias beside it is the handlers' bias operand itself (one byte a key:
    # no float [B, 1, T, S] array is built by XLA's where); the engine folds it only for the
    # kernels that add a bias's values. Same results as jax's, under jit, grad and vmap.
    import re
    q, k, v, w = inputs(key, jnp.float32)
    mask = _mask((B, 1, T, S))(key)

    def loss(q, k, v, mask):
        return jnp.sum(fusedattn.dot_product_attention(q, k, v, mask=mask) * w)

    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v, mask).as_text()
    calls = re.findall(r"custom_call @fusedattn_attn_(?:fwd|bwd)\((.*)", text)
    assert len(calls) >= 2, text
    assert all(f"tensor<{B}x1x{T}x{S}xi1>" in c for c in calls), calls
    assert f"tensor<{B}x1x{T}x{S}xf32>" not in text
    want = jax.grad(lambda q, k, v: jnp.sum(jax.nn.dot_product_attention(
        q, k, v, mask=mask, implementation="xla") * w), argnums=(0, 1, 2))(q, k, v)
    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v, mask)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    masks = jnp.stack([mask, ~mask | (jnp.arange(S) == 0)])  # each row keeps a key or more
    ours = jax.vmap(lambda m: fusedattn.dot_product_attention(q, k, v, mask=m))(masks)
    theirs = jax.vmap(lambda m: jax.nn.dot_product_attention(q, k, v, mask=m,
                                                             implementation="xla"))(masks)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-6)


def test_a_keep_mask_must_be_boolean(key):
    # fused_attn's internal keep mask (dot_product_attention's mask alone) is checked at trace
    # time; a boolean bias without it is refused as any non-float bias.
    q, k, v, _ = inputs(key, jnp.float32)
    kw = dict(attn_bias_type=fusedattn.AttnBiasType.POST_SCALE_BIAS)
    with pytest.raises(ValueError, match="keep mask .* must be a boolean array; got dtype float32"):
        fusedattn.fused_attn((q, k, v), jnp.zeros((1, 1, T, S)), None, None, _mask_bias=True,
                             _mask_keep_only=True, **kw)
    with pytest.raises(ValueError, match="bias must be a float array; got dtype bool"):
        fusedattn.fused_attn((q, k, v), jnp.ones((1, 1, T, S), bool), None, None, **kw)


def test_the_engine_rebuilds_empty_rows(key):
    # A row that keeps nothing gets its kv head's average of the values from the engine,
    # and fused_attn refuses the request where its rule does not hold.
    q, k, v, _ = inputs(key, jnp.float32)
    mask = _mask((B, 1, T, S))(key)
    out = fusedattn.dot_product_attention(q, k, v, mask=mask)
    want = jnp.mean(v, axis=1)[0, jnp.arange(N) // (N // K)]  # batch 0's row 3 keeps nothing
    np.testing.assert_allclose(np.asarray(out[0, 3]), np.asarray(want), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="_average_empty_rows takes a BSHD layout.*dropout"):
        fusedattn.fused_attn((q, k, v), None, None, jax.random.PRNGKey(0),
                             dropout_probability=0.1, is_training=True, _average_empty_rows=True)


def test_forward_mode_and_second_order_with_empty_rows(key):
    # jvp and grad of grad run the reference's derivatives, which rebuild the empty rows as
    # the engine does: they match jax's on a mask that empties a row.
    q, k, v, w = inputs(key, jnp.float32, T=16, S=24)
    mask = _mask((B, 1, 16, 24))(jax.random.fold_in(key, 1))
    ours = lambda q, k, v: fusedattn.dot_product_attention(q, k, v, mask=mask)
    theirs = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
    tangents = tuple(0.5 * x for x in inputs(jax.random.fold_in(key, 2), jnp.float32, T=16, S=24)[:3])
    for run in (lambda f: jax.jvp(f, (q, k, v), tangents),
                lambda f: jax.grad(lambda v: jnp.sum(jax.grad(
                    lambda q: jnp.sum(f(q, k, v) * w))(q) ** 2))(v)):
        for a, b in zip(jax.tree.leaves(run(ours)), jax.tree.leaves(run(theirs))):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
