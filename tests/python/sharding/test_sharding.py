"""Multi-device partitioning (issue 21) on 8 virtual CPU devices: every primitive under
batch (data parallel, FSDP) and head (tensor parallel) sharding equals the single-device
call (float32, to rounding), its outputs keep the inputs' sharding, and the compiled HLO
has no collective in the forward and only the reductions the math needs in the backward.

The root conftest gives the process 8 CPU devices (XLA_FLAGS).
"""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SequenceDescriptor, SoftmaxType

pytestmark = pytest.mark.skipif(len(jax.devices("cpu")) < 8,
                                reason="needs 8 CPU devices (XLA_FLAGS, tests/python/conftest.py)")

# name -> (mesh shape, axis names, batch axes, head axes)
MESHES = {
    "dp": ((8,), ("dp",), "dp", None),
    "dp_tp": ((4, 2), ("dp", "tp"), "dp", "tp"),
    "fsdp_tp": ((4, 2), ("fsdp", "tp"), "fsdp", "tp"),
    "dp_fsdp_tp": ((2, 2, 2), ("dp", "fsdp", "tp"), ("dp", "fsdp"), "tp"),
}
ALL_MESHES = list(MESHES)
TP_MESHES = ["dp_tp", "dp_fsdp_tp"]

_COLLECTIVE = re.compile(r"= [^=]*?\b(all-gather|all-reduce|all-to-all|collective-permute|"
                         r"reduce-scatter)(-start)?\(")


def mesh_of(name):
    shape, axes, batch, heads = MESHES[name]
    devices = np.array(jax.devices("cpu")[:8]).reshape(shape)
    return Mesh(devices, axes), batch, heads


def collectives(compiled_text: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for m in _COLLECTIVE.finditer(compiled_text):
        found[m.group(1)] = found.get(m.group(1), 0) + 1
    return found


def put(mesh, x, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


def close(name, got, want, tol=2e-6):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert not np.isnan(got).any() or np.isnan(want).any(), f"{name}: NaN"
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=name)


def normal(key, shape):
    return jax.random.normal(key, shape, jnp.float32)


# ---------------------------------------------------------------------------
# fused_attn: one case = the call's keyword arguments and how its arrays are built


B, S, HQ, D = 8, 24, 4, 16


def _inputs(key, layout, hkv, hq=HQ, with_bias=None, offset=False):
    ks = jax.random.split(key, 6)
    q = normal(ks[0], (B, S, hq, D))
    k = normal(ks[1], (B, S, hkv, D))
    v = normal(ks[2], (B, S, hkv, D))
    if layout in (QKVLayout.BS3HD, QKVLayout.T3HD):
        arrays = {"qkv": jnp.stack([q, k, v], axis=2)}
    elif layout in (QKVLayout.BSHD_BS2HD, QKVLayout.THD_T2HD):
        arrays = {"q": q, "kv": jnp.stack([k, v], axis=2)}
    else:
        arrays = {"q": q, "k": k, "v": v}
    if with_bias is not None:
        bb, bh = with_bias
        arrays["bias"] = normal(ks[3], (bb, bh, S, S))
    if offset:
        arrays["softmax_offset"] = normal(ks[4], (hq,))
    return arrays


def _specs(arrays, batch, heads, kv_heads):
    specs = {}
    for name, x in arrays.items():
        if name == "qkv":
            specs[name] = P(batch, None, None, heads, None)
        elif name == "kv":
            specs[name] = P(batch, None, None, kv_heads, None)
        elif name in ("k", "v"):
            specs[name] = P(batch, None, kv_heads, None)
        elif name == "q":
            specs[name] = P(batch, None, heads, None)
        elif name == "bias":
            specs[name] = P(batch if x.shape[0] > 1 else None, heads if x.shape[1] > 1 else None)
        elif name in ("softmax_offset",):
            specs[name] = P(heads)
        elif name.startswith("sm_"):
            # score_mod operands are concatenated into one buffer: pass them replicated
            # (each device reads its batch / head slice of them)
            specs[name] = P()
        else:
            specs[name] = P(batch)
    return specs


def _call(arrays, kw, descriptor_fn=None):
    layout = kw.get("qkv_layout", QKVLayout.BSHD_BSHD_BSHD)
    if "qkv" in arrays:
        qkv = (arrays["qkv"],)
    elif "kv" in arrays:
        qkv = (arrays["q"], arrays["kv"])
    else:
        qkv = (arrays["q"], arrays["k"], arrays["v"])
    sd = descriptor_fn(arrays) if descriptor_fn is not None else None
    extra = {}
    if "softmax_offset" in arrays:
        extra["softmax_offset"] = arrays["softmax_offset"]
    if "sm_op" in arrays:
        extra["score_mod_operands"] = (arrays["sm_op"], arrays["sm_slope"])
    return fusedattn.fused_attn(qkv, arrays.get("bias"), sd, 7, **kw, **extra)


def _run(mesh_name, arrays, kw, descriptor_fn=None, grad_names=None, expect_bwd=None,
         fwd_allowed=()):
    """The call sharded on the mesh and on one device: forward (out, max_logit, softmax_aux)
    and the gradients of a fixed random projection of out; HLO collectives checked."""
    mesh, batch, heads = mesh_of(mesh_name)
    hkv_dim = {"k": 2, "kv": 3}
    kv_heads = heads
    for n, d in hkv_dim.items():
        if n in arrays and heads is not None:
            tp = mesh.shape[heads]
            if arrays[n].shape[d] % tp:
                kv_heads = None  # the caller keeps them whole (the library warns otherwise)
    specs = _specs(arrays, batch, heads, kv_heads)
    sharded = {n: put(mesh, x, specs[n]) for n, x in arrays.items()}
    kw = dict(kw, return_max_logit=True, return_aux=True)

    def fwd(arrs):
        return _call(arrs, dict(kw), descriptor_fn)

    grad_names = [n for n in (grad_names or arrays) if n in arrays]
    proj = normal(jax.random.key(5), fwd(arrays)[0].shape)

    def loss(diff, rest):
        out, _ = fwd({**rest, **diff})
        return jnp.sum(out * proj)

    def split(arrs):
        return ({n: x for n, x in arrs.items() if n in grad_names},
                {n: x for n, x in arrs.items() if n not in grad_names})

    f1 = jax.jit(fwd)
    g1 = jax.jit(jax.grad(loss))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fwd_text = f1.lower(sharded).compile().as_text()
        bwd_text = g1.lower(*split(sharded)).compile().as_text()
        out, aux = f1(sharded)
        grads = g1(*split(sharded))
    ref_out, ref_aux = jax.jit(fwd)(arrays)
    ref_grads = jax.jit(jax.grad(loss))(*split(arrays))
    close("out", out, ref_out)
    close("max_logit", aux["max_logit"], ref_aux["max_logit"])
    lse, ref_lse = np.asarray(aux["softmax_aux"]), np.asarray(ref_aux["softmax_aux"])
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    close("softmax_aux", lse[fin], ref_lse[fin])
    for n in grads:
        close(f"d{n}", grads[n], ref_grads[n], tol=5e-6)
    # Output shardings: out like q (batch and heads), softmax_aux with the batch.
    q_spec = specs.get("q", specs.get("qkv"))
    assert out.sharding.spec[0] == q_spec[0], out.sharding
    assert aux["softmax_aux"].sharding.spec[0] == q_spec[0], aux["softmax_aux"].sharding
    head_dim = 3 if "qkv" in specs else 2
    assert tuple(out.sharding.spec)[2:3] == (q_spec[head_dim],) or q_spec[head_dim] is None
    for n in grads:
        assert grads[n].sharding.is_equivalent_to(sharded[n].sharding, grads[n].ndim), (
            n, grads[n].sharding, sharded[n].sharding)
    # HLO: the forward's only collectives are max_logit's NaN-preserving max over the batch
    # shards (a max and an any-NaN: reference.nan_max).
    fwd_coll = collectives(fwd_text)
    for c in fwd_coll:
        assert c in ("all-reduce",) + tuple(fwd_allowed), (c, fwd_coll)
    assert fwd_coll.get("all-reduce", 0) <= 2, fwd_coll
    bwd_coll = collectives(bwd_text)
    assert set(bwd_coll) <= {"all-reduce"}, bwd_coll
    if expect_bwd is not None:
        assert bwd_coll.get("all-reduce", 0) == expect_bwd, bwd_coll
    return caught, fwd_text, bwd_text


def _fwd_only_collectives(mesh_name, arrays, kw, descriptor_fn=None):
    mesh, batch, heads = mesh_of(mesh_name)
    specs = _specs(arrays, batch, heads, heads)
    sharded = {n: put(mesh, x, specs[n]) for n, x in arrays.items()}
    f = jax.jit(lambda a: _call(a, dict(kw), descriptor_fn))
    return collectives(f.lower(sharded).compile().as_text()), f(sharded)


LAYOUTS = [QKVLayout.BSHD_BSHD_BSHD, QKVLayout.BS3HD, QKVLayout.BSHD_BS2HD]
MASKS = [AttnMaskType.NO_MASK, AttnMaskType.CAUSAL_MASK, AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK]


@pytest.mark.parametrize("mesh_name", ALL_MESHES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: l.name)
def test_layouts(mesh_name, layout):
    hkv = HQ if layout == QKVLayout.BS3HD else 2
    arrays = _inputs(jax.random.key(1), layout, hkv)
    _run(mesh_name, arrays, dict(qkv_layout=layout, attn_mask_type=AttnMaskType.CAUSAL_MASK),
         expect_bwd=0)


def test_no_collective_without_statistics():
    """Without max_logit, the forward has no collective at all (and no gather)."""
    arrays = _inputs(jax.random.key(2), QKVLayout.BSHD_BSHD_BSHD, 2)
    coll, out = _fwd_only_collectives("dp_fsdp_tp", arrays,
                                      dict(attn_mask_type=AttnMaskType.CAUSAL_MASK))
    assert coll == {}, coll
    assert out.sharding.spec[0] == ("dp", "fsdp") and out.sharding.spec[2] == "tp"


def test_local_call_is_a_shard():
    """Each device's FFI call gets 1/N of the batch and heads: the custom call's operand
    in the compiled HLO is [B / 4, S, H / 2, D]."""
    arrays = _inputs(jax.random.key(3), QKVLayout.BSHD_BSHD_BSHD, 2)
    mesh, batch, heads = mesh_of("dp_tp")
    specs = _specs(arrays, batch, heads, heads)
    sharded = {n: put(mesh, x, specs[n]) for n, x in arrays.items()}
    text = jax.jit(lambda a: _call(a, {})).lower(sharded).compile().as_text()
    calls = [l for l in text.splitlines() if 'custom_call_target="fusedattn_attn_fwd' in l]
    assert calls, "no fused attention custom call"
    assert all(f"f32[{B // 4},{S},{HQ // 2},{D}]" in l for l in calls), calls


@pytest.mark.parametrize("mesh_name", TP_MESHES)
@pytest.mark.parametrize("mask", MASKS + [AttnMaskType.PADDING_CAUSAL_MASK],
                         ids=lambda m: m.name)
def test_masks(mesh_name, mask):
    arrays = _inputs(jax.random.key(4), QKVLayout.BSHD_BSHD_BSHD, 2)
    desc = None
    if mask.is_padding():
        arrays["q_lens"] = jnp.array([S, 3, 0, 17, S, 1, 9, 20], jnp.int32)
        arrays["kv_lens"] = jnp.array([S, 5, 4, 0, 11, S, 2, 20], jnp.int32)
        desc = lambda a: SequenceDescriptor.from_seqlens((a["q_lens"], a["kv_lens"]))
    _run(mesh_name, arrays, dict(attn_mask_type=mask), descriptor_fn=desc,
         grad_names=["q", "k", "v"], expect_bwd=0)


@pytest.mark.parametrize("mesh_name", ["dp", "dp_fsdp_tp"])
def test_window(mesh_name):
    arrays = _inputs(jax.random.key(5), QKVLayout.BSHD_BSHD_BSHD, 4)
    _run(mesh_name, arrays, dict(attn_mask_type=AttnMaskType.CAUSAL_MASK, window_size=(5, 0)),
         expect_bwd=0)


@pytest.mark.parametrize("mesh_name", ["dp_tp", "dp_fsdp_tp"])
@pytest.mark.parametrize("layout", [QKVLayout.THD_THD_THD, QKVLayout.THD_T2HD, QKVLayout.T3HD],
                         ids=lambda l: l.name)
def test_thd(mesh_name, layout):
    arrays = _inputs(jax.random.key(6), layout, HQ if layout == QKVLayout.T3HD else 2)
    M = 3
    rng = np.random.default_rng(0)
    lens = rng.integers(0, S // M + 1, size=(B, M)).astype(np.int32)
    arrays["q_lens"] = jnp.asarray(lens)
    arrays["kv_lens"] = jnp.asarray(lens[:, ::-1].copy())
    desc = lambda a: SequenceDescriptor.from_seqlens((a["q_lens"], a["kv_lens"]))
    _run(mesh_name, arrays, dict(qkv_layout=layout, attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
                                 max_segments_per_seq=M),
         descriptor_fn=desc, grad_names=["q", "k", "v", "kv", "qkv"], expect_bwd=0)


# bias broadcast pattern -> all-reduces of dbias in the backward on the dp_tp mesh
BIAS = {"1H": ((1, HQ), 1), "B1": ((B, 1), 1), "BH": ((B, HQ), 0), "11": ((1, 1), 1)}


@pytest.mark.parametrize("mesh_name", TP_MESHES)
@pytest.mark.parametrize("bias", list(BIAS))
def test_bias(mesh_name, bias):
    shape, n_reduce = BIAS[bias]
    arrays = _inputs(jax.random.key(7), QKVLayout.BSHD_BSHD_BSHD, 2, with_bias=shape)
    _run(mesh_name, arrays, dict(attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
                                 attn_mask_type=AttnMaskType.CAUSAL_MASK), expect_bwd=n_reduce)


@pytest.mark.parametrize("mesh_name", TP_MESHES)
@pytest.mark.parametrize("hq,hkv", [(4, 2), (4, 1), (6, 3), (8, 2)])
def test_gqa(mesh_name, hq, hkv):
    """kv heads that divide by tp are sharded; others replicated, with the warning, and
    their gradients summed over tp (one all-reduce of dk and dv)."""
    arrays = _inputs(jax.random.key(8), QKVLayout.BSHD_BSHD_BSHD, hkv, hq=hq)
    fusedattn._partition._warned.clear()
    caught, _, _ = _run(mesh_name, arrays, dict(attn_mask_type=AttnMaskType.CAUSAL_MASK),
                        expect_bwd=0 if hkv % 2 == 0 else 1)
    replicated = [w for w in caught if "kv heads do not divide" in str(w.message)]
    assert bool(replicated) == (hkv % 2 != 0), [str(w.message) for w in caught]


@pytest.mark.parametrize("mesh_name", TP_MESHES)
@pytest.mark.parametrize("softmax_type", [SoftmaxType.LEARNABLE_SOFTMAX,
                                          SoftmaxType.OFF_BY_ONE_SOFTMAX], ids=lambda s: s.name)
def test_sinks(mesh_name, softmax_type):
    learnable = softmax_type == SoftmaxType.LEARNABLE_SOFTMAX
    arrays = _inputs(jax.random.key(9), QKVLayout.BSHD_BSHD_BSHD, 2, offset=learnable)
    # d softmax_offset is summed over the batch shards: one all-reduce.
    _run(mesh_name, arrays, dict(softmax_type=softmax_type,
                                 attn_mask_type=AttnMaskType.CAUSAL_MASK),
         expect_bwd=1 if learnable else 0)


@pytest.mark.parametrize("broadcast", [False, True], ids=["own", "broadcast"])
@pytest.mark.parametrize("mesh_name", ALL_MESHES)
def test_dropout_mask_does_not_depend_on_the_mesh(mesh_name, broadcast):
    """Philox counters are global (batch, head) indices: the sharded training call equals
    the single-device one, dropout mask and all (with dropout_broadcast every shard draws
    batch 0's, head 0's mask)."""
    arrays = _inputs(jax.random.key(10), QKVLayout.BSHD_BSHD_BSHD, 2)
    _run(mesh_name, arrays, dict(attn_mask_type=AttnMaskType.CAUSAL_MASK,
                                 dropout_probability=0.3, is_training=True,
                                 dropout_broadcast=broadcast), expect_bwd=0)


def _alibi(s, b, h, qi, ki, per_batch, slope):
    # reads the global batch and head index and two operands: [B, 1, 1, 1] and [1, H, 1, 1]
    return s + slope * (ki - qi).astype(jnp.float32) + per_batch * (b + 1) - 0.1 * h


@pytest.mark.parametrize("mesh_name", ALL_MESHES)
def test_score_mod_with_operands(mesh_name):
    arrays = _inputs(jax.random.key(11), QKVLayout.BSHD_BSHD_BSHD, 2)
    arrays["sm_op"] = normal(jax.random.key(12), (B, 1, 1, 1))
    arrays["sm_slope"] = jnp.linspace(0.1, 0.4, HQ).reshape(1, HQ, 1, 1)
    # the operands' gradients are summed over the shards: one all-reduce (both in one)
    mesh, batch, heads = mesh_of(mesh_name)
    caught, _, bwd = _run(mesh_name, arrays, dict(attn_mask_type=AttnMaskType.CAUSAL_MASK,
                                                  score_mod=_alibi))
    assert collectives(bwd).get("all-reduce", 0) >= 1


def test_shard_map_per_device_call():
    """Inside shard_map the primitive is the per-device call on the local shard."""
    mesh, batch, heads = mesh_of("dp_tp")
    arrays = _inputs(jax.random.key(13), QKVLayout.BSHD_BSHD_BSHD, 2)
    spec = P("dp", None, "tp", None)

    def local(q, k, v):
        return fusedattn.fused_attn((q, k, v), None, None, 0,
                                    attn_mask_type=AttnMaskType.CAUSAL_MASK)

    f = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec))
    out = f(*(put(mesh, arrays[n], spec) for n in "qkv"))
    close("out", out, local(arrays["q"], arrays["k"], arrays["v"]))
    assert collectives(f.lower(*(put(mesh, arrays[n], spec) for n in "qkv")).compile()
                       .as_text()) == {}


def test_sequence_sharding_is_gathered_with_a_warning():
    """The sequence dim is not partitioned (context parallelism is): a sequence-sharded
    q is gathered, and a warning says so; the result is still right."""
    mesh, _, _ = mesh_of("dp_tp")
    arrays = _inputs(jax.random.key(14), QKVLayout.BSHD_BSHD_BSHD, 2)
    spec = P("dp", "tp", None, None)
    sharded = [put(mesh, arrays[n], spec) for n in "qkv"]
    f = jax.jit(lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, 0,
                                                     attn_mask_type=AttnMaskType.CAUSAL_MASK))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = f.lower(*sharded).compile().as_text()
    assert any("does not partition it" in str(w.message) for w in caught), caught
    assert "all-gather" in collectives(text)
    close("out", f(*sharded), f(arrays["q"], arrays["k"], arrays["v"]))


def test_vmap_over_sharded_batch():
    mesh, _, _ = mesh_of("dp_tp")
    arrays = _inputs(jax.random.key(15), QKVLayout.BSHD_BSHD_BSHD, 2)
    stack = lambda x: jnp.stack([x, 2 * x])
    spec = P(None, "dp", None, "tp", None)
    q, k, v = (put(mesh, stack(arrays[n]), spec) for n in "qkv")
    f = jax.vmap(lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, 0,
                                                      attn_mask_type=AttnMaskType.CAUSAL_MASK))
    jf = jax.jit(f)
    assert collectives(jf.lower(q, k, v).compile().as_text()) == {}
    close("out", jf(q, k, v), f(*(stack(arrays[n]) for n in "qkv")))


# ---------------------------------------------------------------------------
# small-seq and softmax


@pytest.mark.parametrize("mesh_name", ["dp", "dp_tp"])
@pytest.mark.parametrize("hkv", [4, 1])
def test_small_seq_bshd(mesh_name, hkv):
    from fusedattn import fused_attn_small_seq
    mesh, batch, heads = mesh_of(mesh_name)
    ks = jax.random.split(jax.random.key(16), 3)
    q = normal(ks[0], (B, 1, HQ, 64))
    k, v = normal(ks[1], (B, 16, hkv, 64)), normal(ks[2], (B, 16, hkv, 64))
    kv_heads = heads if heads is not None and hkv % mesh.shape[heads] == 0 else None
    qs = put(mesh, q, P(batch, None, heads))
    ks_, vs = (put(mesh, x, P(batch, None, kv_heads)) for x in (k, v))

    def f(q, k, v):
        return fused_attn_small_seq((q, k, v), None, None, None,
                                    attn_mask_type=AttnMaskType.NO_MASK,
                                    qkv_layout=QKVLayout.BSHD_BSHD_BSHD)

    proj = normal(jax.random.key(17), q.shape)
    loss = lambda q, k, v: jnp.sum(f(q, k, v) * proj)
    jf, jg = jax.jit(f), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert collectives(jf.lower(qs, ks_, vs).compile().as_text()) == {}
        bwd = collectives(jg.lower(qs, ks_, vs).compile().as_text())
        out, grads = jf(qs, ks_, vs), jg(qs, ks_, vs)
    assert set(bwd) <= {"all-reduce"} and bwd.get("all-reduce", 0) == (
        1 if heads is not None and kv_heads is None else 0), bwd
    close("out", out, f(q, k, v))
    for n, g, r in zip("qkv", grads, jax.grad(loss, argnums=(0, 1, 2))(q, k, v)):
        close(f"d{n}", g, r, tol=5e-6)
    assert out.sharding.spec[0] == batch


def test_small_seq_thd_heads():
    from fusedattn import SmallSeqDescriptor, fused_attn_small_seq
    mesh, _, _ = mesh_of("dp_tp")
    T, n = 32, 8
    ks = jax.random.split(jax.random.key(18), 3)
    # 4 packs (sharded over dp), tokens whole, heads over tp
    q = normal(ks[0], (4, n, HQ, 64))
    k, v = normal(ks[1], (4, T, 2, 64)), normal(ks[2], (4, T, 2, 64))
    offs = jnp.broadcast_to(jnp.arange(0, T + 1, T // n, dtype=jnp.int32), (4, n + 1))
    qoffs = jnp.broadcast_to(jnp.arange(n + 1, dtype=jnp.int32), (4, n + 1))
    sd = SmallSeqDescriptor.from_cu_seqlens(qoffs, offs, max_segment_seqlen_kv=T // n)

    def f(q, k, v):
        return fused_attn_small_seq((q, k, v), None, sd, None)

    qs = put(mesh, q, P("dp", None, "tp"))
    ks_, vs = (put(mesh, x, P("dp", None, "tp")) for x in (k, v))
    jf = jax.jit(f)
    assert collectives(jf.lower(qs, ks_, vs).compile().as_text()) == {}
    close("out", jf(qs, ks_, vs), f(q, k, v))
    loss = lambda q, k, v: jnp.sum(f(q, k, v) ** 2)
    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    assert collectives(g.lower(qs, ks_, vs).compile().as_text()) == {}
    for n_, a, b in zip("qkv", g(qs, ks_, vs), jax.grad(loss, argnums=(0, 1, 2))(q, k, v)):
        close(f"d{n_}", a, b, tol=5e-6)


@pytest.mark.parametrize("mesh_name", ["dp_tp", "dp_fsdp_tp"])
@pytest.mark.parametrize("kind", ["scaled", "scaled_masked", "scaled_upper_triang_masked"])
def test_softmax(mesh_name, kind):
    mesh, batch, heads = mesh_of(mesh_name)
    x = normal(jax.random.key(19), (B, HQ, 16, 32))
    mask = (jax.random.uniform(jax.random.key(20), (B, 1, 16, 32)) < 0.3
            if kind == "scaled_masked" else None)
    xs = put(mesh, x, P(batch, heads))
    ms = None if mask is None else put(mesh, mask, P(batch))
    f = lambda x, m: fusedattn.softmax(x, m, 0.7, kind)
    proj = normal(jax.random.key(21), x.shape)
    g = jax.grad(lambda x, m: jnp.sum(f(x, m) * proj))
    jf, jg = jax.jit(f), jax.jit(g)
    assert collectives(jf.lower(xs, ms).compile().as_text()) == {}
    assert collectives(jg.lower(xs, ms).compile().as_text()) == {}
    y = jf(xs, ms)
    close("y", y, f(x, mask))
    close("dx", jg(xs, ms), g(x, mask))
    assert y.sharding.is_equivalent_to(xs.sharding, 4)


def test_dot_product_attention_drop_in():
    """The jax.nn.dot_product_attention drop-in (a dense boolean mask, GQA) partitions too."""
    mesh, batch, heads = mesh_of("dp_tp")
    ks = jax.random.split(jax.random.key(22), 4)
    q, k, v = normal(ks[0], (B, S, HQ, D)), normal(ks[1], (B, S, 2, D)), normal(ks[2], (B, S, 2, D))
    mask = jax.random.uniform(ks[3], (B, 1, S, S)) < 0.8
    spec = P(batch, None, heads, None)
    args = [put(mesh, x, spec) for x in (q, k, v)] + [put(mesh, mask, P(batch))]
    f = lambda q, k, v, m: fusedattn.dot_product_attention(q, k, v, mask=m, is_causal=True)
    jf = jax.jit(f)
    assert collectives(jf.lower(*args).compile().as_text()) == {}
    out = jf(*args)
    close("out", out, f(q, k, v, mask))
    assert out.sharding.spec[0] == batch and out.sharding.spec[2] == heads
