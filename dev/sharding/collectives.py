"""Counts the collectives XLA compiles for sharded fused_attn calls on 8 virtual CPU
devices: the forward (without and with max_logit) and the gradient, per mesh and
configuration. Prints a markdown table (the numbers of issue 21's closing note).

    python dev/sharding/collectives.py
"""

import os
import re
import warnings

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import fusedattn  # noqa: E402
from fusedattn import AttnBiasType, AttnMaskType, SoftmaxType  # noqa: E402

MESHES = {"dp 8": ((8,), ("dp",), "dp", None), "dp 4 x tp 2": ((4, 2), ("dp", "tp"), "dp", "tp"),
          "dp 2 x fsdp 2 x tp 2": ((2, 2, 2), ("dp", "fsdp", "tp"), ("dp", "fsdp"), "tp")}
B, S, H, D = 8, 64, 4, 32
_COLL = re.compile(r"= [^=]*?\b(all-gather|all-reduce|all-to-all|collective-permute|"
                   r"reduce-scatter)(-start)?\(")


def count(text):
    found = {}
    for m in _COLL.finditer(text):
        found[m.group(1)] = found.get(m.group(1), 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(found.items())) or "none"


def configs():
    slope = jnp.linspace(0.1, 0.5, H).reshape(1, H, 1, 1)
    alibi = lambda s, b, h, qi, ki, sl: s - sl * jnp.abs(qi - ki).astype(jnp.float32)
    return {
        "causal": (2, {}, {}),
        "GQA kv 1 (replicated)": (1, {}, {}),
        "bias [1, H, S, S]": (2, {"bias": (1, H)}, dict(attn_bias_type=AttnBiasType.POST_SCALE_BIAS)),
        "learnable sink": (2, {"offset": True}, dict(softmax_type=SoftmaxType.LEARNABLE_SOFTMAX)),
        "dropout 0.1": (2, {}, dict(dropout_probability=0.1, is_training=True)),
        "score_mod ALiBi (operand)": (2, {"slope": slope}, dict(score_mod=alibi)),
    }


def main():
    rows = []
    for mname, (shape, axes, batch, heads) in MESHES.items():
        mesh = Mesh(np.array(jax.devices()[:8]).reshape(shape), axes)
        for cname, (hkv, extra, kw) in configs().items():
            ks = jax.random.split(jax.random.key(0), 5)
            q = jax.random.normal(ks[0], (B, S, H, D))
            k = jax.random.normal(ks[1], (B, S, hkv, D))
            v = jax.random.normal(ks[2], (B, S, hkv, D))
            tp = 1 if heads is None else mesh.shape[heads]
            kvh = heads if hkv % tp == 0 else None
            put = lambda x, s: jax.device_put(x, NamedSharding(mesh, s))
            args = {"q": put(q, P(batch, None, heads)), "k": put(k, P(batch, None, kvh)),
                    "v": put(v, P(batch, None, kvh))}
            if "bias" in extra:
                args["bias"] = put(jax.random.normal(ks[3], extra["bias"] + (S, S)), P(None, heads))
            if "offset" in extra:
                args["softmax_offset"] = put(jax.random.normal(ks[4], (H,)), P(heads))
            if "slope" in extra:
                args["slope"] = put(extra["slope"], P())

            def fwd(a, stats=False):
                more = {}
                if "softmax_offset" in a:
                    more["softmax_offset"] = a["softmax_offset"]
                if "slope" in a:
                    more["score_mod_operands"] = (a["slope"],)
                return fusedattn.fused_attn((a["q"], a["k"], a["v"]), a.get("bias"), None, 3,
                                            attn_mask_type=AttnMaskType.CAUSAL_MASK,
                                            return_max_logit=stats, **kw, **more)

            loss = lambda a: jnp.sum(fwd(a) ** 2)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                f0 = count(jax.jit(fwd).lower(args).compile().as_text())
                f1 = count(jax.jit(lambda a: fwd(a, True)).lower(args).compile().as_text())
                g = count(jax.jit(jax.grad(loss)).lower(args).compile().as_text())
            rows.append((mname, cname, f0, f1, g))
    print("| mesh | call | forward | forward + max_logit | gradient (fwd + bwd) |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
