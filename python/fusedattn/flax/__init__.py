"""Flax modules on fusedattn: fusedattn.flax.linen and fusedattn.flax.nnx.

Each has DotProductAttention, MultiHeadAttention, make_attention_fn and attention_fn.
Importing fusedattn never imports Flax; importing fusedattn.flax does.
"""

from . import linen, nnx

__all__ = ["linen", "nnx"]
