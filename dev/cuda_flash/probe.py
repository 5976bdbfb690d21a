"""The CUDA flash kernels on the GPU against the CPU engine (the same call on jax's CPU
device: float32 math, trusted by the CPU test suite): forward, lse, max_logit and
gradients for calls cuDNN declines; then float32 speed against
jax.nn.dot_product_attention(implementation="xla"). See dev/cuda_flash/README.md.

    python dev/cuda_flash/probe.py [--no-bench]
"""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType, QKVLayout, SequenceDescriptor, SoftmaxType

CPU = jax.devices("cpu")[0]
GPU = jax.devices()[0]


def call(dtype, B=2, Sq=256, Skv=256, Hq=4, Hkv=2, D=64, Dv=None, bias=None,
         mask=AttnMaskType.CAUSAL_MASK, softmax=SoftmaxType.VANILLA_SOFTMAX, window=None,
         seqlens=None, dropout=0.0, seed=0):
    Dv = Dv or D
    ks = jax.random.split(jax.random.PRNGKey(seed), 5)
    q = jax.random.normal(ks[0], (B, Sq, Hq, D), jnp.float32).astype(dtype)
    k = jax.random.normal(ks[1], (B, Skv, Hkv, D), jnp.float32).astype(dtype)
    v = jax.random.normal(ks[2], (B, Skv, Hkv, Dv), jnp.float32).astype(dtype)
    b = None
    if bias is not None:
        b = (jax.random.normal(ks[3], (1, Hq, Sq, Skv), jnp.float32) * 0.5).astype(dtype)
    off = (jnp.linspace(-1.0, 1.0, Hq, dtype=jnp.float32)
           if softmax == SoftmaxType.LEARNABLE_SOFTMAX else None)
    kw = dict(attn_bias_type=bias or AttnBiasType.NO_BIAS, attn_mask_type=mask,
              qkv_layout=QKVLayout.BSHD_BSHD_BSHD, softmax_type=softmax, window_size=window,
              scaling_factor=float(D) ** -0.5, dropout_probability=dropout)
    lens = None if seqlens is None else tuple(np.array(x, np.int32) for x in seqlens)
    return (q, k, v, b, off), kw, lens


def run_on(device, arrays, kw, lens):
    q, k, v, b, off = jax.device_put(arrays, device)
    desc = None
    if lens is not None:
        desc = SequenceDescriptor.from_seqlens(tuple(jax.device_put(jnp.asarray(x), device) for x in lens))
    w = jax.device_put(jnp.cos(jnp.arange(q.shape[0] * q.shape[1] * q.shape[2] * v.shape[3],
                                          dtype=jnp.float32) * 0.01).reshape(q.shape[:3] + v.shape[3:]), device)

    def f(q, k, v, b, off):
        o, aux = fusedattn.fused_attn((q, k, v), b, desc, 0, softmax_offset=off, is_training=True,
                                      return_aux=True, return_max_logit=True, **kw)
        return o, aux["softmax_aux"], aux["max_logit"]

    def loss(q, k, v, b, off):
        o = f(q, k, v, b, off)[0]
        return jnp.sum(o.astype(jnp.float32) * w)

    argn = tuple(i for i, x in enumerate((q, k, v, b, off)) if x is not None)
    outs = jax.jit(f)(q, k, v, b, off)
    grads = jax.jit(jax.grad(loss, argnums=argn))(q, k, v, b, off)
    info = fusedattn.get_backend((q, k, v), b, desc, 0, is_training=True, softmax_offset=off,
                                 platform=device.platform, **kw)
    return [np.asarray(x, np.float32) for x in outs], [np.asarray(x, np.float32) for x in grads], info


def err(a, b):
    fin = np.isfinite(b)
    same_nonfinite = np.array_equal(np.isnan(a), np.isnan(b))
    d = np.abs(a - b)[fin & np.isfinite(a)]
    scale = max(1.0, float(np.max(np.abs(b[fin]))) if fin.any() else 1.0)
    return (float(d.max()) / scale if d.size else 0.0), same_nonfinite


CASES = [
    ("f32 causal", dict(dtype=jnp.float32)),
    ("f32 no mask GQA D72", dict(dtype=jnp.float32, mask=AttnMaskType.NO_MASK, D=72)),
    ("f32 padding", dict(dtype=jnp.float32, mask=AttnMaskType.PADDING_CAUSAL_MASK,
                         seqlens=([200, 37], [256, 100]))),
    ("f32 window bottom-right Sq>Skv", dict(dtype=jnp.float32, Sq=300, Skv=200,
                                            mask=AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK, window=(64, 0))),
    ("f32 post bias learnable sink", dict(dtype=jnp.float32, bias=AttnBiasType.POST_SCALE_BIAS,
                                          softmax=SoftmaxType.LEARNABLE_SOFTMAX)),
    ("f32 off-by-one", dict(dtype=jnp.float32, softmax=SoftmaxType.OFF_BY_ONE_SOFTMAX)),
    ("f32 dropout", dict(dtype=jnp.float32, dropout=0.2)),
    ("bf16 pre-scale bias", dict(dtype=jnp.bfloat16, bias=AttnBiasType.PRE_SCALE_BIAS)),
    ("bf16 D100", dict(dtype=jnp.bfloat16, D=100)),
    ("bf16 D512 Dv384", dict(dtype=jnp.bfloat16, D=512, Dv=384, Sq=128, Skv=128)),
    ("fp16 D384", dict(dtype=jnp.float16, D=384, Sq=192, Skv=192)),
    ("f32 D512", dict(dtype=jnp.float32, D=512, Sq=128, Skv=160, mask=AttnMaskType.NO_MASK)),
    ("bf16 bottom-right Sq>Skv", dict(dtype=jnp.bfloat16, Sq=320, Skv=128,
                                      mask=AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK)),
]


def check():
    print(f"{'case':34s} {'gpu backend':12s} {'out':>9s} {'lse':>9s} {'maxlog':>9s} {'grads':>9s} nan-same")
    bad = 0
    for name, c in CASES:
        arrays, kw, lens = call(**c)
        try:
            go, gg, ginfo = run_on(GPU, arrays, kw, lens)
            co, cg, _ = run_on(CPU, arrays, kw, lens)
        except Exception as e:  # noqa: BLE001 - a probe reports and goes on
            print(f"{name:34s} ERROR {type(e).__name__}: {str(e)[:300]}")
            bad += 1
            continue
        es = [err(a, b) for a, b in zip(go, co)]
        ge = [err(a, b) for a, b in zip(gg, cg)]
        same = all(s for _, s in es + ge)
        gmax = max(e for e, _ in ge)
        print(f"{name:34s} {ginfo.name:12s} {es[0][0]:9.2e} {es[1][0]:9.2e} {es[2][0]:9.2e} "
              f"{gmax:9.2e} {same}", flush=True)
    return bad


def timeit(f, *a, n=10):
    jax.block_until_ready(f(*a))
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            r = f(*a)
        jax.block_until_ready(r)
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e3


def bench():
    """float32 causal B1 S8192 H8 D64, at jax's default matmul precision (TF32: ours and
    XLA's) and under "highest" (ours 3xTF32, XLA float32)."""
    B, S, H, D = 1, 8192, 8, 64
    ks = jax.random.split(jax.random.PRNGKey(1), 3)
    q, k, v = (jax.random.normal(x, (B, S, H, D), jnp.float32) for x in ks)
    mk_ours = lambda: jax.jit(lambda q, k, v: fusedattn.fused_attn(
        (q, k, v), None, None, 0, attn_mask_type=AttnMaskType.CAUSAL_MASK))
    mk_xla = lambda: jax.jit(lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation="xla"))
    print(f"float32 causal B{B} S{S} H{H} D{D} ({jax.devices()[0].device_kind}):")
    for precision in (None, "highest"):
        with jax.default_matmul_precision(precision):
            for name, mk in (("cuda_flash", mk_ours), ("xla", mk_xla)):
                f = mk()
                g = jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v)), argnums=(0, 1, 2)))
                tf = timeit(f, q, k, v)
                tg = timeit(g, q, k, v, n=3)
                print(f"  {name:10s} precision={str(precision):8s} fwd {tf:8.3f} ms   fwd+bwd {tg:8.3f} ms",
                      flush=True)
    ours, xla = mk_ours(), mk_xla()
    for name, f in (("cuda_flash", ours), ("xla", xla)):
        ma = f.lower(q, k, v).compile().memory_analysis()
        print(f"  {name:10s} forward temp {ma.temp_size_in_bytes / 2**20:.1f} MiB")
    big = 65536
    qb, kb, vb = (jax.random.normal(x, (1, big, 2, 64), jnp.float32) for x in ks)
    try:
        t = timeit(ours, qb, kb, vb, n=2)
        print(f"  cuda_flash float32 causal S {big} H 2: fwd {t:.1f} ms")
    except Exception as e:  # noqa: BLE001
        print(f"  S {big}: {type(e).__name__}: {str(e)[:200]}")


if __name__ == "__main__":
    with jax.default_matmul_precision("highest"):  # float32 at float32 accuracy: 3xTF32
        bad = check()
    if "--no-bench" not in sys.argv:
        bench()
    sys.exit(1 if bad else 0)
