"""attention_fn: fusedattn behind Flax's dot_product_attention hook, the same function for
flax.linen.MultiHeadDotProductAttention(attention_fn=...) and
flax.nnx.MultiHeadAttention(attention_fn=...).

Speed: a causal model should say so (make_attention_fn(is_causal=True), or nnx's
is_causal=True) rather than pass a dense causal mask (Flax's make_causal_mask): the causal
mask type skips the key tiles above the diagonal everywhere; a dense mask is folded into a
bias, whose emptied tiles the CPU engine and the Hopper kernels skip too (without dropout:
dot_product_attention; the Hopper backward at head dims 64 and 128) but cuDNN (the GPU
backward at head dim 256) reads in full.
"""

from __future__ import annotations

from . import _common

__all__ = ["attention_fn", "make_attention_fn"]


def make_attention_fn(*, is_causal: bool = False, local_window_size=None):
    """An attention_fn for Flax's attention modules, always causal with is_causal=True
    (and with nnx's is_causal=True per call) and sliding-window with local_window_size
    (jax.nn.dot_product_attention's (left, right)); a mask Flax passes is applied as well.

    The hook: (query [batch..., Sq, Hq, D], key / value [batch..., Skv, Hkv, D], bias,
    mask (bool or float, nonzero keeps), broadcast_dropout, dropout_rng, dropout_rate,
    deterministic, dtype, precision, module, is_causal) -> [batch..., Sq, Hq, D].
    precision and module are accepted and unused (the engine has its own precision: float32
    accumulation; attention weights are never formed, so there is nothing to sow).
    Dropout draws fused_attn's seed from dropout_rng; broadcast_dropout (Flax's default True)
    shares one mask over the batch and heads as Flax's does (fused_attn's dropout_broadcast:
    on the GPU the CUDA flash kernels), False drops each probability on its own."""
    default_causal = bool(is_causal)

    def attention_fn(query, key, value, bias=None, mask=None, broadcast_dropout=True,
                     dropout_rng=None, dropout_rate=0.0, deterministic=False, dtype=None,
                     precision=None, module=None, is_causal=False):
        return _common.flax_attention(
            query, key, value, bias, mask, dropout_rng=dropout_rng, dropout_rate=dropout_rate,
            deterministic=deterministic, dtype=dtype, is_causal=default_causal or is_causal,
            local_window_size=local_window_size, broadcast_dropout=broadcast_dropout)

    return attention_fn


attention_fn = make_attention_fn()
