"""A score_mod (softcap, ALiBi) with or without a bias at head dims 64, 128 and 256: forward and
forward+backward ms on the current route (the Hopper kernels) and on the route before (the
Hopper kernels off, or only the Hopper backward: --before bwd), in one process (the Hopper modes
switched by _lib.set_hopper_fwd / _bwd between compilations), beside the same call without the
score_mod and jax's cuDNN without it.

  python dev/hopper_bwd/softcap_bias_time.py [--mod softcap|alibi] [--no-bias] [--slopes-grad]
      [--before both|bwd] [--dims 64 128 256] [--seq 4096] [--batch 2] [--heads 8] [--repeats 3]

bf16, causal; the bias post-scale [B, H, S, S] with its gradient taken (dbias); softcap 30, ALiBi
slopes 2^(-8 h / H) (a constant, or learnable with --slopes-grad). Session 44: softcap + bias
(the defaults; before = the CUDA flash kernels both ways); session 45: ALiBi at head dim 256
(--mod alibi [--no-bias] --before bwd: cuDNN's backward or the flash kernels' before).
"""

import argparse

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType, _lib
from fusedattn.bench.common import time_fn


def softcap(s, b, h, q, k):
    return 30.0 * jnp.tanh(s / 30.0)


def alibi(s, b, h, q, k, slopes):
    return s - slopes * (q - k).astype(jnp.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mod", choices=["softcap", "alibi"], default="softcap")
    ap.add_argument("--no-bias", action="store_true")
    ap.add_argument("--slopes-grad", action="store_true", help="ALiBi: the slopes' gradient taken too")
    ap.add_argument("--before", choices=["both", "bwd"], default="both",
                    help="the route before: the Hopper kernels off both ways, or only the backward")
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    B, S, H = a.batch, a.seq, a.heads
    use_bias = not a.no_bias
    kw = dict(attn_mask_type=AttnMaskType.CAUSAL_MASK)
    if use_bias:
        kw["attn_bias_type"] = AttnBiasType.POST_SCALE_BIAS
    slopes = jnp.exp2(-8.0 * jnp.arange(1, H + 1, dtype=jnp.float32) / H).reshape(1, H, 1, 1)
    fn = softcap if a.mod == "softcap" else alibi
    ops = () if a.mod == "softcap" else (slopes,)
    grad_ops = a.mod == "alibi" and a.slopes_grad
    name = a.mod + ("+bias" if use_bias else "")
    print(f"bf16 B {B} S {S} H {H} causal, {name}" + (", bias [B, H, S, S] with dbias" if use_bias else "") +
          (", slopes' gradient" if grad_ops else "") + "; ms forward / forward+backward")
    for D in a.dims:
        ks = jax.random.split(jax.random.PRNGKey(D), 5)
        n = lambda k, shape: jax.random.normal(k, shape, jnp.float32).astype(jnp.bfloat16)
        q, k, v, do = (n(kk, (B, S, H, D)) for kk in ks[:4])
        bias = n(ks[4], (B, H, S, S)) if use_bias else None
        args = (q, k, v, bias, ops)
        argnums = (0, 1, 2) + ((3,) if use_bias else ()) + ((4,) if grad_ops else ())

        def make(score_mod):
            def fwd(q, k, v, b, o):
                sm = dict(score_mod=score_mod, score_mod_operands=o) if score_mod else {}
                return fusedattn.fused_attn((q, k, v), b, None, None, **kw, **sm)
            loss = lambda q, k, v, b, o, do: jnp.sum(fwd(q, k, v, b, o).astype(jnp.float32) * do.astype(jnp.float32))
            return jax.jit(fwd), jax.jit(jax.grad(loss, argnums=argnums))

        def cudnn():
            f = lambda q, k, v, b, o: jax.nn.dot_product_attention(q, k, v, bias=b, is_causal=True,
                                                                   implementation="cudnn")
            loss = lambda q, k, v, b, o, do: jnp.sum(f(q, k, v, b, o).astype(jnp.float32) * do.astype(jnp.float32))
            return jax.jit(f), jax.jit(jax.grad(loss, argnums=(0, 1, 2) + ((3,) if use_bias else ())))

        rows = {}
        off_fwd = None if a.before == "bwd" else "off"
        plain = "bias alone" if use_bias else "plain"
        for row, modes, mod in ((f"{name} hopper", (None, None), fn), (f"{name} before", (off_fwd, "off"), fn),
                                (plain, (None, None), None), (f"jax cudnn {plain}", (None, None), "cudnn")):
            _lib.set_hopper_fwd(modes[0])
            _lib.set_hopper_bwd(modes[1])
            try:
                fwd, grad = cudnn() if mod == "cudnn" else make(mod)
                info = "" if mod == "cudnn" else fusedattn.get_backend(
                    (q, k, v), bias, None, None, score_mod=mod, score_mod_operands=ops if mod else (),
                    is_training=True, score_mod_grads=bool(grad_ops and mod), **kw)
                t_f = time_fn(fwd, args, repeats=a.repeats)[0] * 1e3
                t_b = time_fn(grad, args + (do,), repeats=a.repeats)[0] * 1e3
            finally:
                _lib.set_hopper_fwd(None)
                _lib.set_hopper_bwd(None)
            rows[row] = (t_f, t_b)
            kern = f"{info.forward}/{info.backward}" if info else "cudnn"
            print(f"D {D:3d} {row:24s} {kern:22s} {t_f:8.3f} {t_b:8.3f}", flush=True)
        h, f = rows[f"{name} hopper"], rows[f"{name} before"]
        p, c = rows[plain], rows[f"jax cudnn {plain}"]
        print(f"D {D:3d} speed-up over the route before {f[0] / h[0]:.2f}x / {f[1] / h[1]:.2f}x; "
              f"x {plain} {p[0] / h[0]:.2f} / {p[1] / h[1]:.2f}; x jax cuDNN ({plain}) "
              f"{c[0] / h[0]:.2f} / {c[1] / h[1]:.2f}", flush=True)


if __name__ == "__main__":
    main()
