"""GPU machine: where a score_mod's time goes in cuDNN's graph. Times (ms, median) plain
fused_attn and score_mod variants at S 4096, B 4, H 16, D 128, bf16, with and without the
causal mask, forward and forward+backward: softcap written with tanh, with a sigmoid
(2 sigmoid(2x) - 1) and with exp (1 - 2 / (exp(2x) + 1)), an identity score_mod (the
modifier's own cost) and ALiBi. PYTHONPATH: an installed fusedattn."""

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnMaskType
from fusedattn.bench.common import time_fn

B, S, H, D, C = 4, 4096, 16, 128, 50.0
MODS = {
    "identity": lambda s, b, h, q, k: s,
    "softcap tanh": lambda s, b, h, q, k: jnp.tanh(s / C) * C,
    "softcap sigmoid": lambda s, b, h, q, k: (2.0 * jax.nn.sigmoid(s * (2.0 / C)) - 1.0) * C,
    "softcap exp": lambda s, b, h, q, k: C - (2.0 * C) / (jnp.exp(s * (2.0 / C)) + 1.0),
    "alibi": lambda s, b, h, q, k: s - 0.5 * (q - k).astype(jnp.float32),
}


def main():
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, do = (jax.random.normal(kk, (B, S, H, D), jnp.float32).astype(jnp.bfloat16)
                   for kk in ks)
    for mask in (AttnMaskType.CAUSAL_MASK, AttnMaskType.NO_MASK):
        for name, fn in [("plain", None)] + list(MODS.items()):
            f = lambda q, k, v, fn=fn: fusedattn.fused_attn((q, k, v), None, None, None,
                                                            attn_mask_type=mask, score_mod=fn)
            loss = lambda q, k, v, do: jnp.sum(f(q, k, v).astype(jnp.float32) * do)
            fwd = time_fn(jax.jit(f), (q, k, v))[0] * 1e3
            both = time_fn(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), (q, k, v, do))[0] * 1e3
            print(f"{mask.name:<12} {name:<16} fwd {fwd:6.3f} ms  fwd+bwd {both:6.3f} ms",
                  flush=True)


if __name__ == "__main__":
    main()
