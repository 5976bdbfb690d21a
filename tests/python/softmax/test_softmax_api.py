"""softmax's contract: bad calls fail at trace time with a message naming the argument
(the engine's own validate(), through the C API), the FFI handlers reject them again,
is_softmax_kernel_available() gives the engine's answer, and the Python enum and the
ctypes mirror agree with the C++ side."""

import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from fusedattn import SoftmaxFusionType, _lib
from softmax_helpers import CAUSAL, MASKED, SCALED

sm = importlib.import_module("fusedattn.softmax")


def sds(shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def trace(logits, mask=None, scale=1.0, kind=SCALED):
    return jax.eval_shape(lambda x, m: fusedattn.softmax(x, m, scale, kind), logits, mask)


def raises(exc, *patterns):
    return pytest.raises(exc, match="".join(f"(?=.*{re.escape(p)})" for p in patterns))


def test_enum_codes_are_the_engines():
    assert [int(m) for m in SoftmaxFusionType] == [0, 1, 2]
    for m in SoftmaxFusionType:
        assert _lib.lib.fa_softmax_type_name(int(m)).decode() == m.name
    assert _lib.lib.fa_softmax_type_name(3).decode() == "unknown"


@pytest.mark.parametrize("value, expected", [
    ("scaled", SCALED), ("SCALED_MASKED", MASKED), ("scaled_upper_triang_masked", CAUSAL),
    (0, SCALED), (2, CAUSAL), (SoftmaxFusionType.SCALED_MASKED, MASKED)])
def test_softmax_type_spellings(value, expected):
    assert sm._fusion_type(value) is expected


def params(**kw):
    shape = kw.pop("shape", (2, 3, 5, 7))
    mask_shape = kw.pop("mask_shape", None)
    p = sm._params(shape, kw.pop("dtype", jnp.bfloat16), mask_shape, kw.pop("kind", SCALED),
                   kw.pop("scale", 0.5))
    for k, v in kw.items():
        setattr(p, k, v)
    return p


# Each field of the ctypes mirror, set to a bad value, must be reported under its own name.
FIELDS = {
    "dims": (dict(shape=(2, 0, 5, 7)), "logits: got shape [2, 0, 5, 7]"),
    "rank": (dict(rank=9), "logits: got rank 9"),
    "mask_dims": (dict(kind=MASKED, mask_shape=(2, 2, 5, 7)), "mask: shape [2, 2, 5, 7]"),
    "has_mask": (dict(kind=MASKED), "SCALED_MASKED needs a mask"),
    "softmax_type": (dict(softmax_type=5), "softmax_type: got code 5"),
    "dtype": (dict(dtype=jnp.float64), "dtype: got code -1"),
    "scale": (dict(scale=float("inf")), "scale_factor: got inf"),
}


@pytest.mark.parametrize("field", FIELDS)
def test_each_params_field_is_read_as_itself(field):
    overrides, expected = FIELDS[field]
    code, msg = _lib.softmax_validate(params(**overrides))
    assert code == _lib.STATUS_INVALID and expected in msg, msg


def test_good_params_validate():
    assert _lib.softmax_validate(params()) == (_lib.STATUS_OK, "")
    assert _lib.softmax_validate(params(kind=MASKED, mask_shape=(1, 3, 1, 7)))[0] == 0


# ---------------------------------------------------------------------------
# Trace-time errors


def test_logits_must_be_floating():
    with raises(ValueError, "logits dtype int32 is not floating"):
        trace(sds((2, 3, 5, 7), jnp.int32))


@pytest.mark.parametrize("kind, shape", [(SCALED, (5, 7)), (SCALED, (1, 2, 3, 5, 7)),
                                         (MASKED, (6, 5, 7)), (CAUSAL, (7,))])
def test_rank(kind, shape):
    mask = sds(shape, jnp.bool_) if kind == MASKED else None
    with raises(ValueError, "logits must have shape [batch, heads, q_seqlen, kv_seqlen]",
                str(shape)):
        trace(sds(shape), mask, kind=kind)


def test_rank_3_is_accepted_without_a_mask():
    for kind in (SCALED, CAUSAL):
        assert trace(sds((6, 5, 5)), kind=kind).shape == (6, 5, 5)


def test_mask_rules():
    x = sds((2, 3, 5, 7))
    with raises(ValueError, "SCALED_MASKED needs a mask", "True = masked out"):
        trace(x, None, kind=MASKED)
    for kind in (SCALED, CAUSAL):
        with raises(ValueError, f"softmax_type={kind.name} takes no mask"):
            trace(x, sds((2, 1, 5, 7), jnp.bool_), kind=kind)
    with raises(ValueError, "mask must be a bool array", "uint8"):
        trace(x, sds((2, 1, 5, 7), jnp.uint8), kind=MASKED)
    with raises(ValueError, "mask must have rank 4", "(5, 7)"):
        trace(x, sds((5, 7), jnp.bool_), kind=MASKED)
    for bad in [(2, 3, 5, 1), (2, 2, 5, 7), (4, 1, 5, 7), (2, 1, 3, 7)]:
        with raises(ValueError, f"mask: shape [{', '.join(map(str, bad))}] does not broadcast "
                    "to logits [2, 3, 5, 7]"):
            trace(x, sds(bad, jnp.bool_), kind=MASKED)


def test_other_arguments():
    x = sds((2, 3, 5, 7))
    with raises(ValueError, "softmax_type='causal' is not a SoftmaxFusionType",
                "SCALED_UPPER_TRIANG_MASKED"):
        trace(x, kind="causal")
    with raises(ValueError, "softmax_type=7"):
        trace(x, kind=7)
    with raises(ValueError, "scale_factor: got nan; must be finite"):
        trace(x, scale=float("nan"))
    with raises(ValueError, "logits: got shape [2, 0, 5, 7]"):
        trace(sds((2, 0, 5, 7)))
    with raises(ValueError, "kv_seqlen"):
        trace(sds((1, 1, 1, (1 << 20) + 1)))


# One table of bad arguments, by kind and by value: a ValueError or a TypeError
# (ArgumentTypeError is both) naming the argument.

_X = sds((2, 3, 5, 7))
BAD = [
    ("logits list", lambda: fusedattn.softmax([[1.0]]), TypeError,
     ["logits must be an array", "list"]),
    ("logits None", lambda: fusedattn.softmax(None), TypeError, ["logits must be an array"]),
    ("logits complex", lambda: trace(sds((2, 3, 5, 7), jnp.complex64)), ValueError,
     ["logits dtype complex64"]),
    ("logits bool", lambda: trace(sds((2, 3, 5, 7), jnp.bool_)), ValueError, ["logits dtype bool"]),
    ("mask list", lambda: fusedattn.softmax(jnp.ones((2, 3, 5, 7)), [[True]], 1.0, MASKED),
     TypeError, ["mask must be a bool array", "list"]),
    ("scale str", lambda: trace(_X, scale="2"), TypeError, ["scale_factor must be a real scalar",
                                                          "'2'"]),
    ("scale bool", lambda: trace(_X, scale=True), TypeError, ["scale_factor", "True"]),
    ("scale None", lambda: trace(_X, scale=None), TypeError, ["scale_factor", "None"]),
    ("scale complex", lambda: trace(_X, scale=1j), TypeError, ["scale_factor", "1j"]),
    ("scale vector", lambda: trace(_X, scale=np.ones(2)), TypeError,
     ["scale_factor", "shape (2,)"]),
    ("scale inf", lambda: trace(_X, scale=float("inf")), ValueError,
     ["scale_factor: got inf; must be finite"]),
    ("scale 1e39", lambda: trace(_X, scale=1e39), ValueError, ["scale_factor", "float32"]),
    ("scale 10**400", lambda: trace(_X, scale=10 ** 400), ValueError, ["scale_factor", "float32"]),
    ("type bool", lambda: trace(_X, kind=True), TypeError, ["softmax_type", "True"]),
    ("type None", lambda: trace(_X, kind=None), ValueError, ["softmax_type=None"]),
    ("available batch float", lambda: fusedattn.is_softmax_kernel_available(
        "scaled", 2.5, 4, 8, 64, jnp.float32, platform="cpu"), TypeError, ["batch", "2.5"]),
    ("available kv_seqlen str", lambda: fusedattn.is_softmax_kernel_available(
        "scaled", 2, 4, 8, "64", jnp.float32, platform="cpu"), TypeError, ["kv_seqlen", "'64'"]),
]


@pytest.mark.parametrize("call, exc, what", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_arguments(call, exc, what):
    with raises(exc, *what):
        call()


def test_sizes_past_int64_are_not_served():
    # never wrapped to a small size by the C struct
    assert not fusedattn.is_softmax_kernel_available("scaled", 2 ** 64 + 2, 4, 8, 64,
                                                     jnp.float32, platform="cpu")


@pytest.mark.parametrize("kind", [SCALED, MASKED, CAUSAL], ids=lambda k: k.name)
def test_a_traced_scale_is_folded_into_the_logits(kind):
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k1, (2, 3, 5, 5), jnp.float32)
    dy = jax.random.normal(k2, x.shape, jnp.float32)
    mask = jax.random.bernoulli(k3, 0.3, (2, 1, 5, 5)) if kind == MASKED else None
    loss = lambda f: lambda x, s: jnp.vdot(f(x, mask, s, kind), dy)
    ours = jax.jit(jax.value_and_grad(loss(fusedattn.softmax), (0, 1)))(x, jnp.float32(0.7))
    ref = jax.jit(jax.value_and_grad(loss(fusedattn.softmax_fallback), (0, 1)))(
        x, jnp.float32(0.7))
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------
# The FFI handlers check again (a call that skips the Python checks)


def ffi_fwd(*args, **attrs):
    call = jax.ffi.ffi_call("fusedattn_softmax_fwd", sds(args[0].shape, args[0].dtype))
    return call(*args, **attrs)


@pytest.mark.parametrize("args, attrs, expected", [
    ((np.ones((2, 3), np.float32),), dict(softmax_type=np.int32(7), scale=np.float32(1)),
     "softmax_type: got code 7"),
    ((np.ones((2, 3), np.float32),), dict(softmax_type=np.int32(1), scale=np.float32(1)),
     "SCALED_MASKED needs a mask"),
    ((np.ones((2, 3), np.float32), np.ones((2, 3), np.int8)),
     dict(softmax_type=np.int32(1), scale=np.float32(1)), "mask: got dtype code"),
    ((np.ones((2, 3), np.float32), np.zeros((2, 3), bool)),
     dict(softmax_type=np.int32(1), scale=np.float32(np.inf)), "scale_factor: got inf"),
    ((np.ones((3,), np.float32),), dict(softmax_type=np.int32(0), scale=np.float32(1)),
     "logits: got shape [3]"),
    ((np.ones((2, 3), np.float32), np.ones((2, 3), np.float32)),
     dict(softmax_type=np.int32(0), scale=np.float32(1)), "out_init: must be aliased"),
], ids=["type", "no-mask", "mask-dtype", "scale", "rank", "out_init"])
def test_the_handler_rejects_bad_calls(args, attrs, expected):
    with pytest.raises(Exception, match=re.escape(expected)):
        jax.block_until_ready(jax.jit(lambda *a: ffi_fwd(*a, **attrs))(*args))


# ---------------------------------------------------------------------------
# is_softmax_kernel_available


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_cpu_kernel_serves_every_valid_call(dtype):
    for kind in SoftmaxFusionType:
        for skv in (1, 7, 16384, 100_000):
            assert fusedattn.is_softmax_kernel_available(kind, 2, 4, 8, skv, dtype,
                                                        platform="cpu")
    assert fusedattn.is_softmax_kernel_available("scaled", 2, 4, 8, 64, dtype) == (
        jax.default_backend() == "cpu" or fusedattn._lib.built_with_cuda())


def test_availability_is_the_engines_rule():
    avail = fusedattn.is_softmax_kernel_available
    cuda = _lib.built_with_cuda()
    for dtype, limit in ((jnp.float32, 16384), (jnp.bfloat16, 32768), (jnp.float16, 32768)):
        assert avail("scaled_masked", 1, 2, 3, limit, dtype, platform="gpu") == cuda
        assert avail("scaled", 1, 2, 3, 16383, dtype, platform="cuda") == cuda
        assert not avail("scaled", 1, 2, 3, limit + 8, dtype, platform="gpu")
    assert not avail("scaled", 1, 2, 3, 16385, jnp.bfloat16, platform="gpu")  # % 8 past 16384
    assert not avail("scaled", 2, 4, 8, 64, jnp.float64, platform="cpu")
    assert not avail("scaled", 2, 4, 8, 64, jnp.int32, platform="cpu")
    assert not avail("scaled", 0, 4, 8, 64, jnp.float32, platform="cpu")
    assert not avail("scaled", 2, 4, 8, 64, jnp.float32, platform="tpu")
    with raises(ValueError, "not a SoftmaxFusionType"):
        avail("sideways", 2, 4, 8, 64, jnp.float32)


def test_reasons_name_the_limit():
    p = params(shape=(1, 1, 4, 40000), dtype=jnp.bfloat16)
    ok, status, reason = _lib.softmax_kernel_available(p, _lib.PLATFORM_CUDA)
    assert not ok and status == _lib.STATUS_OK
    expected = "exceeds the CUDA kernel's 32768" if _lib.built_with_cuda() else "no CUDA kernels"
    assert expected in reason, reason
