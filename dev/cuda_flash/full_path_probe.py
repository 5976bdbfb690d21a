"""Where the CUDA flash forward's time goes on score_mod calls (issue 24): one shape (bf16,
B 2, S 4096, H 8, D 128, causal), the flash kernels forced (as if cuDNN had rejected the
graph), forward only, median ms:
  plain        no bias, no score_mod (the non-FULL kernel)
  bias         POST_SCALE bias [1, H, S, S] (non-FULL)
  bias+drop    the same with dropout 0.1 (the FULL kernel, no score_mod)
  softcap      score_mod softcap, no bias (FULL, closed form)
  alibi        score_mod ALiBi with slopes [1, H, 1, 1] (FULL, closed form)
  alibi+bias   both (the bench fallback alibi row)
  interp       a program no closed form matches (FULL, the interpreter)
  python dev/cuda_flash/full_path_probe.py   (GPU machine, after scripts/gpu_env.sh)"""

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnBiasType, AttnMaskType, _gpu_route, _lib, backends
from fusedattn.bench.common import time_fn

import os

B, S, H, D = 2, int(os.environ.get("PROBE_S", 4096)), 8, 128
_choice = _gpu_route._gpu_choice


def _rejected(fields, want_lse, want_max_logit, training, score_mod=None, flags=0):
    return _choice(fields, want_lse, want_max_logit, training, score_mod,
                   flags | _lib.REQUEST_CUDNN_REJECTED)


_gpu_route._gpu_choice = backends._gpu_choice = _rejected


def softcap(s, b, h, q, k):
    return 30.0 * jnp.tanh(s / 30.0)


def alibi(s, b, h, q, k, slope):
    return s + slope * (k - q).astype(jnp.float32)


def interp(s, b, h, q, k, slope):
    return jnp.where(k > q + 100000, s - 1.0, s) + slope * (k - q).astype(jnp.float32)


def main():
    ks = jax.random.split(jax.random.PRNGKey(0), 5)
    q, k, v = (jax.random.normal(ks[i], (B, S, H, D), jnp.float32).astype(jnp.bfloat16)
               for i in range(3))
    bias = jax.random.normal(ks[3], (1, H, S, S), jnp.float32).astype(jnp.bfloat16)
    slope = -jax.random.uniform(ks[4], (1, H, 1, 1), minval=0.01, maxval=0.1)
    post = AttnBiasType.POST_SCALE_BIAS
    cases = {
        "plain": dict(),
        "bias": dict(bias=bias, attn_bias_type=post),
        "bias+drop": dict(bias=bias, attn_bias_type=post, dropout_probability=0.1,
                          is_training=True, seed=jax.random.PRNGKey(1)),
        "softcap": dict(score_mod=softcap),
        "alibi": dict(score_mod=alibi, score_mod_operands=(slope,)),
        "alibi+bias": dict(bias=bias, attn_bias_type=post, score_mod=alibi,
                           score_mod_operands=(slope,)),
        "interp": dict(score_mod=interp, score_mod_operands=(slope,)),
    }
    print(f"bf16 B{B} S{S} H{H} D{D} causal, forward, flash kernels forced; {jax.devices()[0]}")
    for name, kw in cases.items():
        kw = dict(kw)
        b, seed = kw.pop("bias", None), kw.pop("seed", None)
        f = jax.jit(lambda q, k, v, b=b, seed=seed, kw=kw: fusedattn.fused_attn(
            (q, k, v), b, None, seed, attn_mask_type=AttnMaskType.CAUSAL_MASK, **kw))
        hlo = f.lower(q, k, v).compile().as_text()
        ran = "cuda" if "_cuda" in hlo and "fwd" in hlo else "?"
        t, _ = time_fn(f, (q, k, v), repeats=5)
        print(f"{name:12} {t * 1e3:8.3f} ms  ({ran})")


if __name__ == "__main__":
    main()
