"""A bias (not a folded mask) on the Hopper forward, against cuDNN (GPU machine):
  python dev/hopper_fwd/bias_time.py [--seqlens 2048 4096] [--dims 64 128 256]
bf16, B * S = 16384, H * D = 2048, a bias [1, H, S, S] (cuDNN indexes < 2^31 elements:
S 4096 at most at head dim 64), causal and full. Per row, forward ms:
  post/cudnn   POST_SCALE_BIAS through fused_attn's default route (cuDNN's forward until
               session 34; since then the Hopper forward where Skv is a multiple of 8, so
               compare with jax cudnn, or run with FUSEDATTN_HOPPER_FWD=0 for cuDNN's graph)
  post/hopper  the same with set_hopper_fwd("always") (the Hopper forward adds the bias)
  jax cudnn    jax.nn.dot_product_attention(bias=..., implementation="cudnn")
  pre/flash    PRE_SCALE_BIAS by the default route (the CUDA flash kernels; cuDNN serves none)
  pre/hopper   the same with set_hopper_fwd("always") (the Hopper forward, flash backward)
and forward+backward (gradients of q, k, v) for the pre-scale pair (--fwd-only: not). A call
that fails (cuDNN's 2^31-element limit) prints "-". Prints a table."""

import argparse

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType, _lib
from fusedattn.bench.common import time_fn

PRE, POST = AttnBiasType.PRE_SCALE_BIAS, AttnBiasType.POST_SCALE_BIAS


def ms(mode, fn, args):
    _lib.set_hopper_fwd(mode)
    try:
        return 1e3 * time_fn(jax.jit(lambda *a: fn(*a)), args)[0]
    except Exception:  # noqa: BLE001 - a call cuDNN rejects: no time
        return float("nan")
    finally:
        _lib.set_hopper_fwd(None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--fwd-only", action="store_true")
    a = ap.parse_args()
    print(jax.devices()[0].device_kind)
    head = ("D", "S", "mask", "post/cudnn", "post/hopper", "jax cudnn", "hopper/cudnn",
            "pre/flash", "pre/hopper", "x", "pre f+b flash", "pre f+b hopper", "x")
    print(" | ".join(head))
    for d in a.dims:
        for s in a.seqlens:
            b, h = max(1, 16384 // s), 2048 // d
            ks = jax.random.split(jax.random.PRNGKey(0), 4)
            q, k, v = (jax.random.normal(kk, (b, s, h, d), jnp.bfloat16) for kk in ks[:3])
            bias = jax.random.normal(ks[3], (1, h, s, s), jnp.bfloat16)
            for causal in (True, False):
                mask = AttnMaskType.CAUSAL_MASK if causal else AttnMaskType.NO_MASK
                f = lambda bt: lambda q, k, v, bias: fusedattn.fused_attn(
                    (q, k, v), bias, None, None, attn_bias_type=bt, attn_mask_type=mask)
                fb = lambda bt: jax.grad(lambda q, k, v, bias: jnp.sum(
                    f(bt)(q, k, v, bias).astype(jnp.float32)), argnums=(0, 1, 2))
                jx = lambda q, k, v, bias: jax.nn.dot_product_attention(
                    q, k, v, bias=bias, is_causal=causal, implementation="cudnn")
                args = (q, k, v, bias)
                pc, ph, jc = ms(None, f(POST), args), ms("always", f(POST), args), ms(None, jx, args)
                pf, pr = ms(None, f(PRE), args), ms("always", f(PRE), args)
                bf, br = ((float("nan"),) * 2 if a.fwd_only
                          else (ms(None, fb(PRE), args), ms("always", fb(PRE), args)))
                row = (d, s, "causal" if causal else "full", f"{pc:.3f}", f"{ph:.3f}", f"{jc:.3f}",
                       f"{pc / ph:.2f}", f"{pf:.3f}", f"{pr:.3f}", f"{pf / pr:.2f}",
                       f"{bf:.3f}", f"{br:.3f}", f"{bf / br:.2f}")
                print(" | ".join(map(str, row)), flush=True)


if __name__ == "__main__":
    main()
