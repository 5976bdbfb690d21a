"""A post-scale bias that takes no gradient: fused_attn's forward+backward (gradients of q, k,
v; the bias a constant) with the Hopper backward and with cuDNN's, the same compiled function
switched by fusedattn._lib.set_hopper_bwd, alternating rounds; the forward alone beside them
(cuDNN's, the default for a bias). bf16, B * S = 16384, H * D = 2048, bias [1, H, S, S].
--dbias: the bias's gradient taken too (dbias: float32 sums over the batch where it
broadcasts; --bias-batch: a bias [B, H, S, S], stored straight); --pre: a pre-scale bias,
whose other backward is the CUDA flash kernels' (cuDNN serves none); --softcap C: no bias,
the softcap score_mod c tanh(s / c) instead (cuDNN's backward runs its score_mod graph).
  python dev/hopper_bwd/bias_vs_cudnn.py [--seqlens 4096] [--head-dims 64 128] [--rounds 2]
      [--dbias] [--bias-batch] [--pre] [--softcap C]"""
import argparse

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType, _lib
from fusedattn.bench.common import time_fn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", type=int, nargs="+", default=[4096])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dbias", action="store_true")
    ap.add_argument("--bias-batch", action="store_true")
    ap.add_argument("--pre", action="store_true")
    ap.add_argument("--softcap", type=float, default=0.0)
    args = ap.parse_args()
    cap = args.softcap
    softcap = (lambda s, b, h, qi, ki: cap * jnp.tanh(s / cap)) if cap else None
    other = "flash" if args.pre else "cudnn"
    bias_type = AttnBiasType.PRE_SCALE_BIAS if args.pre else AttnBiasType.POST_SCALE_BIAS
    grads = (0, 1, 2, 4) if args.dbias else (0, 1, 2)
    print(f"softcap {cap}, no bias" if cap else
          f"dbias {args.dbias}, bias batch {'B' if args.bias_batch else 1}, {bias_type.name}")
    print(f"{'D':>4} {'S':>6} {'mask':7} {'fwd ms':>8} {'f+b hopper':>11} {'f+b ' + other:>10} {other + '/hopper':>12}")
    for d in args.head_dims:
        for s in args.seqlens:
            for mask in (AttnMaskType.CAUSAL_MASK, AttnMaskType.NO_MASK):
                b, h = 16384 // s, 2048 // d
                ks = jax.random.split(jax.random.PRNGKey(s + d), 5)
                q, k, v, do = (jax.random.normal(kk, (b, s, h, d), jnp.bfloat16) for kk in ks[:4])
                bias = jax.random.normal(ks[4], (b if args.bias_batch else 1, h, s, s), jnp.bfloat16)
                if cap:
                    f = lambda q, k, v, bias: fusedattn.fused_attn((q, k, v), None, None, None,
                                                                   attn_mask_type=mask, score_mod=softcap)
                else:
                    f = lambda q, k, v, bias: fusedattn.fused_attn((q, k, v), bias, None, None,
                                                                   attn_bias_type=bias_type,
                                                                   attn_mask_type=mask)
                loss = lambda q, k, v, do, bias: jnp.sum(f(q, k, v, bias).astype(jnp.float32) * do.astype(jnp.float32))
                fb = jax.jit(jax.grad(loss, argnums=grads))
                fwd = jax.jit(f)
                times = {"hopper": [], other: []}
                for _ in range(args.rounds):
                    for mode, name in (("always", "hopper"), ("off", other)):
                        _lib.set_hopper_bwd(mode)
                        before = _lib.hopper_bwd_launches()
                        times[name].append(time_fn(fb, (q, k, v, do, bias), repeats=5)[0] * 1e3)
                        ran = _lib.hopper_bwd_launches() > before
                        assert ran == (name == "hopper"), (name, ran)
                _lib.set_hopper_bwd(None)
                tf = time_fn(fwd, (q, k, v, bias), repeats=5)[0] * 1e3
                th, tc = min(times["hopper"]), min(times[other])
                print(f"{d:4d} {s:6d} {mask.name[:7]:7} {tf:8.3f} {th:11.3f} {tc:10.3f} {tc / th:12.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
