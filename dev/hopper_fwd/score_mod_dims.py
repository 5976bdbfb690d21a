"""Softcap and ALiBi forward on the Hopper kernel against cuDNN's forward, per head dim (GPU
machine, fusedattn installed). select_backend sends these score_mods to the Hopper forward at
every head dim it takes, without a table: this checks that it is the faster one there.
bf16, causal, B*S = 16384, H = 2048 / D; forward ms with set_hopper_fwd("always") and
("off") in alternating rounds, the median each.

    python dev/hopper_fwd/score_mod_dims.py [--head-dims 64 128 256] [--seqlens 1024 4096 16384]
"""

import argparse
import statistics

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnMaskType, _lib
from fusedattn.bench.common import time_fn


def softcap(s, b, h, q, k):
    return 30.0 * jnp.tanh(s / 30.0)


def alibi(s, b, h, q, k, slopes):  # slopes [1, H, 1, 1]: the form the kernel recognizes
    return s - slopes * (q - k).astype(jnp.float32)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    print(f"{'mod':7} {'D':>3} {'S':>6} | {'hopper':>7} {'cudnn':>7} | {'ratio':>6}")
    for D in args.head_dims:
        H = 2048 // D
        slopes = jnp.exp2(-8.0 * jnp.arange(1, H + 1, dtype=jnp.float32) / H).reshape(1, H, 1, 1)
        for name, fn, ops in (("softcap", softcap, ()), ("alibi", alibi, (slopes,))):
            for S in args.seqlens:
                B = max(1, 16384 // S)
                ks = jax.random.split(jax.random.PRNGKey(S + D), 3)
                q, k, v = (jax.random.normal(kk, (B, S, H, D), jnp.float32).astype(jnp.bfloat16)
                           for kk in ks)
                f = jax.jit(lambda q, k, v: fusedattn.fused_attn(
                    (q, k, v), None, None, None, attn_mask_type=AttnMaskType.CAUSAL_MASK,
                    score_mod=fn, score_mod_operands=ops))
                ms = {"always": [], "off": []}
                for _ in range(args.rounds):
                    for mode in ms:
                        _lib.set_hopper_fwd(mode)
                        before = _lib.hopper_fwd_launches()
                        ms[mode].append(time_fn(f, (q, k, v), repeats=3)[0] * 1e3)
                        assert (_lib.hopper_fwd_launches() > before) == (mode == "always")
                _lib.set_hopper_fwd(None)
                h, c = statistics.median(ms["always"]), statistics.median(ms["off"])
                print(f"{name:7} {D:3d} {S:6d} | {h:7.3f} {c:7.3f} | {c / h:6.3f}", flush=True)


if __name__ == "__main__":
    main()
