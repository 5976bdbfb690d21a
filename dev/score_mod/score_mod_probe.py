"""GPU machine: which score_mods cuDNN's graph takes. For each score_mod of a list (the
test cases, operands of every broadcast shape, the masks, THD), asks get_backend for the
forward and for training and prints the backend, with cuDNN's first distinct reasons
when it refused. Takes seconds (graphs only, nothing compiled by XLA):
    python dev/score_mod/score_mod_probe.py      (PYTHONPATH: an installed fusedattn)"""

import re
import sys

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnMaskType, QKVLayout, SequenceDescriptor

B, S, H, D = 2, 128, 4, 64


def softcap(s, b, h, q, k):
    return jnp.tanh(s / 20.0) * 20.0


def alibi(s, b, h, q, k, slopes):
    return s - slopes * jnp.abs(q - k).astype(jnp.float32)


def add_operand(s, b, h, q, k, x):
    return s + x


def causal(s, b, h, q, k):
    return jnp.where(q >= k, s, -jnp.inf)


def learnable(s, b, h, q, k, w):
    return s * w + jax.nn.sigmoid(s)


def sign_and_const(s, b, h, q, k):
    return s - 0.1 * jnp.sign(q - k).astype(jnp.float32) + (2.0 - s) * 0.01


def main():
    f32 = jnp.float32
    cases = [("softcap", softcap, ()), ("causal", causal, ()),
             ("learnable scalar", learnable, (jnp.float32(0.7),)),
             ("sign + constant first", sign_and_const, ()),
             ("alibi [1,H,1,1]", alibi, (jax.ShapeDtypeStruct((1, H, 1, 1), f32),)),
             ("alibi [B,H,1,1]", alibi, (jax.ShapeDtypeStruct((B, H, 1, 1), f32),))]
    for shape in [(B, 1, S, 1), (1, H, S, 1), (1, 1, 1, S), (B, 1, 1, S), (1, 1, S, S),
                  (B, H, S, S)]:
        cases.append((f"s + operand {list(shape)}", add_operand,
                      (jax.ShapeDtypeStruct(shape, f32),)))
    bf = jax.ShapeDtypeStruct((B, S, H, D), jnp.bfloat16)
    lens = (jnp.array([S, 40]), jnp.array([S, 77]))
    setups = [("bshd", {}), ("causal mask", dict(attn_mask_type=AttnMaskType.CAUSAL_MASK)),
              ("padding", dict(attn_mask_type=AttnMaskType.PADDING_MASK,
                               sequence_descriptor=SequenceDescriptor.from_seqlens(lens))),
              ("thd", dict(attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
                           qkv_layout=QKVLayout.THD_THD_THD, max_segments_per_seq=3,
                           sequence_descriptor=SequenceDescriptor.from_seqlens(
                               jnp.array([[50, 40, 38], [128, 0, 0]]))))]
    rows = []
    for name, fn, ops in cases:
        for setup, kw in setups if name in ("softcap", "alibi [1,H,1,1]") else setups[:1]:
            for training in (False, True):
                info = fusedattn.get_backend((bf, bf, bf), score_mod=fn, score_mod_operands=ops,
                                             platform="gpu", is_training=training, **kw)
                why = ""
                if info.name != "cudnn":
                    reasons = dict.fromkeys(re.findall(r"Reason: ([^\n]*)", info.reason or ""))
                    why = " | ".join(list(reasons)[:3]) or (info.reason or "")[:200]
                rows.append((name, setup, "train" if training else "fwd", info.name, why))
    w = max(len(r[0]) for r in rows)
    for r in rows:
        print(f"{r[0]:<{w}}  {r[1]:<11} {r[2]:<5} {r[3]:<13} {r[4]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
