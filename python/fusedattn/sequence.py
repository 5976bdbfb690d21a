"""SequenceDescriptor: how long each sequence of a batch really is."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SequenceDescriptor:
    """Per-sequence lengths for the padding masks.

    q_seqlens, kv_seqlens: int32 [B]. Row i of batch b is a real token when
    i < q_seqlens[b] (likewise keys); the rest is padding, which attends to
    nothing and yields zeros. Lengths are clamped to the tensor's sequence
    extent by the kernels.
    """

    q_seqlens: jax.Array
    kv_seqlens: jax.Array

    @classmethod
    def from_seqlens(cls, seqlens) -> "SequenceDescriptor":
        """seqlens: an int array [B] used for both q and kv, or a pair (q_seqlens, kv_seqlens)."""
        if isinstance(seqlens, (tuple, list)):
            if len(seqlens) != 2:
                raise ValueError(
                    "SequenceDescriptor.from_seqlens: seqlens must be an array [B] or a pair "
                    f"(q_seqlens, kv_seqlens); got a sequence of {len(seqlens)} items")
            q, kv = seqlens
        else:
            q = kv = seqlens
        q = jnp.asarray(q)
        kv = jnp.asarray(kv)
        for name, x in (("q_seqlens", q), ("kv_seqlens", kv)):
            if x.ndim != 1 or not jnp.issubdtype(x.dtype, jnp.integer):
                raise ValueError(
                    f"SequenceDescriptor.from_seqlens: {name} must be a 1-D integer array [B]; "
                    f"got shape {x.shape} dtype {x.dtype}")
        if q.shape != kv.shape:
            raise ValueError(
                f"SequenceDescriptor.from_seqlens: q_seqlens {q.shape} and kv_seqlens {kv.shape} "
                "must have the same batch size")
        return cls(q.astype(jnp.int32), kv.astype(jnp.int32))
