"""Head dims that are not whole 16-byte chunks on the GPU (session 21): what they cost now
that they run zero-padded (cuDNN or the register-resident flash kernels) against what ran
them before (the wmma kernels; a score_mod with a bias: XLA's reference). bf16, B 2,
S 4096, H 8, causal; median ms, forward and forward+backward, and the backend that ran.
Run it with this tree's library and with an older one on PYTHONPATH for the "before":
  python dev/cuda_flash/odd_dims_probe.py   (GPU machine, after scripts/gpu_env.sh)"""

import os

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType
from fusedattn.bench.common import time_fn

B, S, H = 2, int(os.environ.get("PROBE_S", 4096)), 8


def alibi(s, b, h, q, k, slope):
    return s + slope * (k - q).astype(jnp.float32)


def _ran(hlo: str) -> str:
    if "fusedattn_attn_fwd" not in hlo:
        return "reference"
    return "fused (cuda)" if "_cuda" in hlo else "fused (cpu)"


def main():
    print(f"bf16 B{B} S{S} H{H} causal; {jax.devices()[0]}")
    ks = jax.random.split(jax.random.PRNGKey(0), 6)
    slope = -jax.random.uniform(ks[4], (1, H, 1, 1), minval=0.01, maxval=0.1)
    bias = jax.random.normal(ks[3], (1, H, S, S), jnp.float32).astype(jnp.bfloat16)
    for D in (100, 60):
        q, k, v, do = (jax.random.normal(ks[i], (B, S, H, D), jnp.float32).astype(jnp.bfloat16)
                       for i in range(4))
        cases = {
            "plain": (None, dict()),
            "alibi+bias": (bias, dict(attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
                                      score_mod=alibi, score_mod_operands=(slope,))),
        }
        for name, (b, kw) in cases.items():
            fwd = jax.jit(lambda q, k, v, b=b, kw=kw: fusedattn.fused_attn(
                (q, k, v), b, None, None, attn_mask_type=AttnMaskType.CAUSAL_MASK, **kw))
            both = jax.jit(jax.grad(lambda q, k, v, f=fwd: jnp.sum(
                f(q, k, v).astype(jnp.float32) * do.astype(jnp.float32)), argnums=(0, 1, 2)))
            ran = _ran(both.lower(q, k, v).compile().as_text())
            t_f, _ = time_fn(fwd, (q, k, v), repeats=5)
            t_b, _ = time_fn(both, (q, k, v), repeats=5)
            print(f"D{D:<4} {name:11} fwd {t_f * 1e3:8.3f} ms  fwd+bwd {t_b * 1e3:8.3f} ms  ({ran})")


if __name__ == "__main__":
    main()
