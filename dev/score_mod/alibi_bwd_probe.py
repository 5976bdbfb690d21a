"""GPU probe: q, k, v gradients of score_mods with an array operand (ALiBi; s + 0 w) on the
cuDNN backward against the float32 reference, MQA and GQA, bottom-right causal."""
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]  # dev/score_mod/ -> the repository root
sys.path[:0] = [str(ROOT / "tests/python"), str(ROOT / "tests/python/score_mod")]  # conftest, test_score_mod
import fusedattn  # noqa: E402
from fusedattn import AttnMaskType  # noqa: E402
from test_score_mod import HQ, ref_call  # noqa: E402


def alibi_reversed(s, b, h, q, k, slopes):
    return (k - q).astype(jnp.float32) * slopes + s


def plus_operand(s, b, h, q, k, w):  # an operand that changes nothing: s + 0 w
    return s + 0.0 * w


mask = AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK
for hkv, Sq, Skv in ((1, 200, 650), (2, 200, 650), (1, 256, 256), (1, 1000, 1000)):
    for name, fn in (("alibi", alibi_reversed), ("s + 0 w", plus_operand)):
        ks = jax.random.split(jax.random.PRNGKey(0), 4)
        q = jax.random.normal(ks[0], (2, Sq, HQ, 128), jnp.float32).astype(jnp.bfloat16)
        k = jax.random.normal(ks[1], (2, Skv, hkv, 128), jnp.float32).astype(jnp.bfloat16)
        v = jax.random.normal(ks[2], (2, Skv, hkv, 128), jnp.float32).astype(jnp.bfloat16)
        do = jax.random.normal(ks[3], (2, Sq, HQ, 128), jnp.float32).astype(jnp.bfloat16)
        slopes = jnp.exp2(-8.0 * jnp.arange(1, HQ + 1, dtype=jnp.float32) / HQ).reshape(1, HQ, 1, 1)
        ours = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, score_mod=fn,
                                                    score_mod_operands=(slopes,),
                                                    attn_mask_type=mask)
        ref = lambda q, k, v: ref_call(q, k, v, fn, (slopes,), attn_mask_type=mask)[0]
        loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))
        g = jax.jit(jax.grad(loss(ours), argnums=(0, 1, 2)))(q, k, v)
        r = jax.grad(loss(ref), argnums=(0, 1, 2))(q, k, v)
        err = lambda a, b: float(np.nanmax(np.abs(np.asarray(a, np.float32) - np.asarray(b))))
        print(f"hkv {hkv} Sq {Sq:4d} Skv {Skv:4d} {name:8s}: max|err| dq dk dv "
              f"{err(g[0], r[0]):.3g} {err(g[1], r[1]):.3g} {err(g[2], r[2]):.3g}; "
              f"max|dq| ours {float(np.max(np.abs(np.asarray(g[0], np.float32)))):.3g} "
              f"ref {float(np.max(np.abs(np.asarray(r[0])))):.3g}", flush=True)
