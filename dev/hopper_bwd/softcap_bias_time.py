"""softcap beside a bias at head dims 64, 128 and 256: forward and forward+backward ms with the
Hopper kernels (the route since session 44) and with them off (the CUDA flash kernels, the
route before), in one process (the Hopper modes switched by _lib.set_hopper_fwd / _bwd between
compilations), beside the same call without softcap (a bias alone: the Hopper kernels) and
jax's cuDNN with the bias alone.

  python dev/hopper_bwd/softcap_bias_time.py [--dims 64 128 256] [--seq 4096] [--batch 2]
      [--heads 8] [--repeats 3]

bf16, causal, post-scale bias [B, H, S, S] whose gradient is taken (dbias), softcap 30.
"""

import argparse

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType, _lib
from fusedattn.bench.common import time_fn


def softcap(s, b, h, q, k):
    return 30.0 * jnp.tanh(s / 30.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    B, S, H = a.batch, a.seq, a.heads
    kw = dict(attn_bias_type=AttnBiasType.POST_SCALE_BIAS, attn_mask_type=AttnMaskType.CAUSAL_MASK)
    print(f"bf16 B {B} S {S} H {H} causal, bias [B, H, S, S] with dbias; ms forward / forward+backward")
    for D in a.dims:
        ks = jax.random.split(jax.random.PRNGKey(D), 5)
        n = lambda k, shape: jax.random.normal(k, shape, jnp.float32).astype(jnp.bfloat16)
        q, k, v, do = (n(kk, (B, S, H, D)) for kk in ks[:4])
        bias = n(ks[4], (B, H, S, S))

        def make(score_mod):
            sm = dict(score_mod=score_mod) if score_mod else {}
            fwd = jax.jit(lambda q, k, v, b: fusedattn.fused_attn((q, k, v), b, None, None, **kw, **sm))
            loss = lambda q, k, v, b, do: jnp.sum(fwd(q, k, v, b).astype(jnp.float32) * do.astype(jnp.float32))
            return fwd, jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))

        def cudnn():
            f = lambda q, k, v, b: jax.nn.dot_product_attention(q, k, v, bias=b, is_causal=True,
                                                                implementation="cudnn")
            loss = lambda q, k, v, b, do: jnp.sum(f(q, k, v, b).astype(jnp.float32) * do.astype(jnp.float32))
            return jax.jit(f), jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))

        rows = {}
        for name, mode, fn in (("softcap+bias hopper", None, softcap), ("softcap+bias flash", "off", softcap),
                               ("bias alone", None, None), ("jax cudnn bias alone", None, "cudnn")):
            _lib.set_hopper_fwd(mode)
            _lib.set_hopper_bwd(mode)
            try:
                fwd, grad = cudnn() if fn == "cudnn" else make(fn)
                info = "" if fn == "cudnn" else fusedattn.get_backend(
                    (q, k, v), bias, None, None, score_mod=fn, is_training=True, **kw)
                t_f = time_fn(fwd, (q, k, v, bias), repeats=a.repeats)[0] * 1e3
                t_b = time_fn(grad, (q, k, v, bias, do), repeats=a.repeats)[0] * 1e3
            finally:
                _lib.set_hopper_fwd(None)
                _lib.set_hopper_bwd(None)
            rows[name] = (t_f, t_b)
            kern = f"{info.forward}/{info.backward}" if info else "cudnn"
            print(f"D {D:3d} {name:22s} {kern:22s} {t_f:8.3f} {t_b:8.3f}", flush=True)
        h, f = rows["softcap+bias hopper"], rows["softcap+bias flash"]
        p, c = rows["bias alone"], rows["jax cudnn bias alone"]
        print(f"D {D:3d} speed-up over the flash kernels {f[0] / h[0]:.2f}x / {f[1] / h[1]:.2f}x; "
              f"x the bias alone {p[0] / h[0]:.2f} / {p[1] / h[1]:.2f}; x jax cuDNN (bias alone) "
              f"{c[0] / h[0]:.2f} / {c[1] / h[1]:.2f}", flush=True)


if __name__ == "__main__":
    main()
