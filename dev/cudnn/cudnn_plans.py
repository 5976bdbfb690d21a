"""GPU machine: times plain fused_attn and softcap / ALiBi score_mods (forward, causal, bf16,
B * S = 16384 tokens, H = 16, D = 128) under the cuDNN plan the environment picks
(FUSEDATTN_CUDNN_HEUR / FUSEDATTN_CUDNN_PLAN, attention/options.h); dev/cudnn/cudnn_plans.sh runs it
once per plan. Prints one line: the plan setting and each function's median ms (or its error)."""

import os
import sys

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnMaskType
from fusedattn.bench.common import time_fn
from fusedattn.bench.score_mod import alibi, softcap


def main():
    S = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    B, H, D = 16384 // S, 16, 128
    ks = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(kk, (B, S, H, D), jnp.float32).astype(jnp.bfloat16) for kk in ks)
    slopes = jnp.exp2(-8.0 * jnp.arange(1, H + 1, dtype=jnp.float32) / H).reshape(1, H, 1, 1)
    mods = {"plain": (None, ()), "softcap": (softcap, ()), "alibi": (alibi, (slopes,))}
    cells = []
    for name, (fn, ops) in mods.items():
        f = jax.jit(lambda q, k, v, fn=fn, ops=ops: fusedattn.fused_attn(
            (q, k, v), None, None, None, attn_mask_type=AttnMaskType.CAUSAL_MASK, score_mod=fn,
            score_mod_operands=ops))
        try:
            cells.append(f"{name} {time_fn(f, (q, k, v), repeats=5)[0] * 1e3:.3f} ms")
        except Exception as e:  # a plan index past the list, a plan that does not build
            cells.append(f"{name} failed ({str(e).splitlines()[0][:80]})")
    setting = (f"S {S} heur {os.environ.get('FUSEDATTN_CUDNN_HEUR', 'A')} "
               f"plan {os.environ.get('FUSEDATTN_CUDNN_PLAN', 'default')}")
    print(f"{setting:<28} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
