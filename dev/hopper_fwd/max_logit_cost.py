"""What return_max_logit costs the forward (GPU machine, fusedattn installed): bf16, B*S = 16384,
H = 2048 / D, forward ms of fused_attn without max_logit and with it, on the Hopper forward
(its kernel keeps each row's exact max and adds one atomic a warp a tile) and on cuDNN
(set_hopper_fwd("off"): its Max / Sum_exp statistics and finalize_forward's reduction),
rounds alternating, the median round each.

    python dev/hopper_fwd/max_logit_cost.py [--head-dims 64 128 256] [--seqlens 4096 16384]
"""

import argparse
import statistics

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnMaskType, _lib
from fusedattn.bench.common import time_fn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    print(f"{'D':>3} {'S':>6} {'mask':6} | {'hopper':>7} {'+max':>7} {'cost':>6} | {'cudnn':>7} {'+max':>7} {'cost':>6}")
    for D in args.head_dims:
        for S in args.seqlens:
            for mask in (AttnMaskType.NO_MASK, AttnMaskType.CAUSAL_MASK):
                B, H = max(1, 16384 // S), 2048 // D
                ks = jax.random.split(jax.random.PRNGKey(S + D), 3)
                q, k, v = (jax.random.normal(kk, (B, S, H, D), jnp.float32).astype(jnp.bfloat16)
                           for kk in ks)
                plain = jax.jit(lambda q, k, v: fusedattn.fused_attn(
                    (q, k, v), None, None, None, attn_mask_type=mask))
                with_max = jax.jit(lambda q, k, v: fusedattn.fused_attn(
                    (q, k, v), None, None, None, attn_mask_type=mask, return_max_logit=True))
                ms = {}
                for _ in range(args.rounds):
                    for mode in ("always", "off"):
                        _lib.set_hopper_fwd(mode)
                        for name, fn in (("plain", plain), ("max", with_max)):
                            before = _lib.hopper_fwd_launches()
                            t = time_fn(fn, (q, k, v), repeats=3)[0] * 1e3
                            assert (_lib.hopper_fwd_launches() > before) == (mode == "always")
                            ms.setdefault((mode, name), []).append(t)
                _lib.set_hopper_fwd(None)
                m = {key: statistics.median(v) for key, v in ms.items()}
                h, hm, c, cm = m["always", "plain"], m["always", "max"], m["off", "plain"], m["off", "max"]
                print(f"{D:3d} {S:6d} {'causal' if mask == AttnMaskType.CAUSAL_MASK else 'full':6} | "
                      f"{h:7.3f} {hm:7.3f} {hm / h - 1:+6.1%} | {c:7.3f} {cm:7.3f} {cm / c - 1:+6.1%}",
                      flush=True)


if __name__ == "__main__":
    main()
