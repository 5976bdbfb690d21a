"""dot_product_attention: jax.nn.dot_product_attention's signature and semantics on
fusedattn's engine, so a JAX model switches by changing an import.

How jax's arguments map onto fused_attn:
* is_causal -> CAUSAL_MASK (top-left, as jax's tril); query_seq_lengths /
  key_value_seq_lengths -> the PADDING masks with a SequenceDescriptor.
* local_window_size (left, right) >= 0 -> window_size (top-left, like jax's).
* mask (boolean) and bias -> one POST_SCALE_BIAS: masked-out logits get a large
  negative number, -0.7 times the largest finite value of q's dtype (float32: jax's own
  number; float16: -45856, no overflow to -inf), which the softmax turns into exactly 0
  as jax's does. Negative window sizes (which jax reads literally) go the same way.
  A mask with no bias beside it goes to the engine as it is, one byte a key
  (_lib.REQUEST_MASK_KEEP_ONLY): the Hopper kernels classify its tiles from those bytes,
  and the other kernels get that fold from the engine itself (no [B, 1, T, S] array of
  q's dtype built by XLA). The call tells the engine the bias is a folded mask
  (_lib.REQUEST_MASK_BIAS): the CPU
  engine and the Hopper forward (sm_90, 16-bit, head dims 64 / 128 / 256) drop those keys
  and skip the key tiles a query tile's rows all drop, and so does the Hopper backward
  (head dims 64, 128 and 256), so a dense causal or window mask costs little more than
  the mask type there; cuDNN (the forward elsewhere) adds it as a bias over every tile
  (is_causal, local_window_size and the sequence lengths are faster there).
* A query row whose every key is masked: jax gives the plain average of all values (its
  masked logits are all the same finite number), zero for rows past query_seq_lengths.
  fusedattn's kernels give 0 for such rows; the call asks the engine to rebuild them
  (fused_attn's _average_empty_rows: after the kernel on every backend, the gradient to
  value only), where they can occur (a mask or bias, key lengths, a window shorter than
  the queries' reach).
Difference that remains: the bias is rounded to the query's dtype (jax adds it to the
float32 logits), as in every fused kernel.

install() makes jax.nn.dot_product_attention itself run this function, for every
implementation hint a caller passes (None, "xla", "cudnn": model libraries such as Keras
pass "xla"), so any code calling jax.nn gets fusedattn's engine; uninstall() or the
installed() context manager restore jax's. fusedattn keeps jax's own function from
import time: dot_product_attention(implementation="xla" | "cudnn") calls it, never
itself.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np

from . import _lib
from ._args import ArgumentTypeError, got, is_traced, static_bool, static_float, static_int
from .attention import fused_attn
from .enums import AttnBiasType, AttnMaskType
from .sequence import SequenceDescriptor

__all__ = ["dot_product_attention", "install", "installed", "uninstall"]

# jax's own function, kept at import: what implementation="xla" / "cudnn" calls, and what
# uninstall() puts back.
_JAX_DOT_PRODUCT_ATTENTION = getattr(jax.nn.dot_product_attention, "_fusedattn_jax_original",
                                     jax.nn.dot_product_attention)  # (a reloaded module)

# jax's stand-in for -inf in masked logits (jax._src.nn.functions._get_large_negative of
# float32, the dtype of its logits for every input dtype up to float32).
_LARGE_NEGATIVE = float(np.float32(-0.7 * np.finfo(np.float32).max))


def _large_negative(dtype) -> float:
    """The masked logit in dtype's bias: jax's number where dtype holds it, else -0.7
    times dtype's largest finite value (float16: -45856.0, never -inf), exact in dtype:
    for the engine's dtypes the engine's own value (_lib.masked_bias_value), which it
    recognizes as a dropped key and skips the key tiles it fills."""
    name = jnp.dtype(dtype).name
    if name in _lib.ATTN_DTYPE_CODES:
        return _lib.masked_bias_value(name)
    return max(_LARGE_NEGATIVE, float(-0.7 * jnp.finfo(dtype).max))


def _ensure_4d(t):
    t = jnp.asarray(t)
    return jnp.expand_dims(t, tuple(range(4 - t.ndim))) if t.ndim < 4 else t


def _check(t, shape, dtype, name):
    # The same checks and messages as jax.nn.dot_product_attention.
    if t is None:
        return
    if t.ndim != len(shape):
        raise ValueError(f"{name} ndim should be {len(shape)}, but got {t.ndim}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} dtype should be {dtype}, but got {t.dtype}")
    for i in range(t.ndim):
        if shape[i] != -1 and t.shape[i] != shape[i]:
            raise ValueError(f"{name} shape should be {shape}: but got {t.shape}")


def _window_mask(T, S, window):
    """jax's window rule, literal for any sign: [1, 1, T, S] bool."""
    left, right = window
    i = jnp.arange(T)[:, None]
    j = jnp.arange(S)[None, :]
    return ((i <= j + left) & (i >= j - right))[None, None]


def dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None,
                          is_causal=False, query_seq_lengths=None, key_value_seq_lengths=None,
                          local_window_size=None, implementation=None, return_residual=False):
    """Scaled dot-product attention, as jax.nn.dot_product_attention (see its docstring).

    query [B, T, N, H] (or [T, N, H]), key / value [B, S, K, H]; bias and mask 4-D,
    broadcastable to [B, N, T, S]; query_seq_lengths / key_value_seq_lengths int32 [B].
    implementation: None runs fusedattn's engine; "xla" and "cudnn" call
    jax.nn.dot_product_attention with that implementation.
    scale: None (1/sqrt(H)), a Python number or a 0-d array, traced too (jit, grad: the
    gradient reaches it, as jax's). local_window_size and is_causal are static.
    Returns the output (query's shape), and with return_residual the log-sum-exp [B, T, N]
    (in key's dtype) too.
    """
    if implementation in ("xla", "cudnn"):
        return _JAX_DOT_PRODUCT_ATTENTION(
            query, key, value, bias, mask, scale=scale, is_causal=is_causal,
            query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
            local_window_size=local_window_size, implementation=implementation,
            return_residual=return_residual)
    if implementation is not None:
        raise ValueError(f"Unsupported implementation option: {implementation}")

    output_shape = jnp.asarray(query).shape
    q, k, v = _ensure_4d(query), _ensure_4d(key), _ensure_4d(value)
    bias = _ensure_4d(bias) if bias is not None else None
    mask = _ensure_4d(mask) if mask is not None else None
    q_lens = jnp.asarray(query_seq_lengths) if query_seq_lengths is not None else None
    kv_lens = jnp.asarray(key_value_seq_lengths) if key_value_seq_lengths is not None else None
    where = "dot_product_attention"
    if local_window_size is not None:
        allowed = "None, a Python int or a pair (left, right) of Python ints"
        if not isinstance(local_window_size, (tuple, list)):
            local_window_size = (local_window_size, local_window_size)
        if len(local_window_size) != 2:
            raise ArgumentTypeError(f"{where}: local_window_size must be {allowed}; got "
                                    f"{got(local_window_size)}")
        local_window_size = tuple(static_int(w, "local_window_size", where, allowed)
                                  for w in local_window_size)
    is_causal = static_bool(is_causal, "is_causal", where)
    if scale is not None and not is_traced(scale):  # a traced scale goes to fused_attn as is
        scale = static_float(scale, "scale", where, "None or a real scalar (a Python number, "
                             "or a traced 0-d float array)")
        if not np.isfinite(scale):
            raise ValueError(f"{where}: scale={scale}; must be finite")
    B, S, K, H = k.shape
    _check(v, [B, S, K, H], k.dtype, "value")
    _check(q, [B, -1, -1, H], k.dtype, "query")
    _check(mask, [-1] * 4, np.dtype(bool), "mask")
    _check(bias, [-1] * 4, None, "bias")
    _check(q_lens, [B], np.dtype("int32"), "query_seq_lengths")
    _check(kv_lens, [B], np.dtype("int32"), "key_value_seq_lengths")
    T, N = q.shape[1], q.shape[2]
    if N % K != 0:
        raise ValueError(f"The number of query heads must be a multiple of key/value heads, but "
                         f"got {N} vs {K}")

    window = None
    if local_window_size is not None:
        window = local_window_size
        if min(window) < 0:  # jax reads negative sizes literally; the engine's -1 is unbounded
            wmask = _window_mask(T, S, window)
            mask = wmask if mask is None else mask & wmask
            window = None

    # A boolean mask alone goes to the engine as it is (keep_only: the engine reads the mask
    # itself, and folds it into the masked value only for the kernels that add a bias's
    # values); with a bias beside it, both fold into one additive bias [1|B, 1|N, T, S].
    keep_only = bias is None
    if mask is not None:
        mask = jnp.broadcast_to(mask, jnp.broadcast_shapes(mask.shape, (1, 1, T, S)))
        if keep_only:
            bias = mask
        else:
            bias = jnp.where(mask, bias, jnp.asarray(_large_negative(q.dtype), q.dtype))
    if bias is not None and not (mask is not None and keep_only):
        bshape = jnp.broadcast_shapes(bias.shape, (1, 1, T, S))
        bias = jnp.broadcast_to(bias, bshape).astype(q.dtype)

    padding = q_lens is not None or kv_lens is not None
    sd = None
    if padding:
        sd = SequenceDescriptor.from_seqlens(
            (q_lens if q_lens is not None else jnp.full((B,), T, jnp.int32),
             kv_lens if kv_lens is not None else jnp.full((B,), S, jnp.int32)))
    mask_type = {(False, False): AttnMaskType.NO_MASK, (False, True): AttnMaskType.CAUSAL_MASK,
                 (True, False): AttnMaskType.PADDING_MASK,
                 (True, True): AttnMaskType.PADDING_CAUSAL_MASK}[(padding, bool(is_causal))]
    # Rows whose every key is masked: jax's softmax over equal logits averages all values
    # (rows past query_seq_lengths are zero in jax too); the engine rebuilds them
    # (_average_empty_rows) where they can occur. A window alone empties rows only past the
    # keys' reach (jax's window is top-left: query i keeps keys i - left .. i + right, so
    # rows i > S - 1 + left keep nothing).
    window_empties = window is not None and T > S + window[0]
    out, aux = fused_attn(
        (q, k, v), bias, sd, None,
        attn_bias_type=AttnBiasType.NO_BIAS if bias is None else AttnBiasType.POST_SCALE_BIAS,
        attn_mask_type=mask_type, scaling_factor=scale, window_size=window,
        return_aux=True, _mask_bias=mask is not None, _mask_keep_only=mask is not None and keep_only,
        _average_empty_rows=bias is not None or kv_lens is not None or window_empties)
    out = jnp.reshape(out, output_shape)
    if not return_residual:
        return out
    lse = jnp.transpose(aux["softmax_aux"][..., 0], (0, 2, 1))  # [B, T, N]
    # jax's residual: logsumexp of the masked logits, which is its large negative for rows
    # that keep nothing (rows past query_seq_lengths included).
    gone = lse <= 0.5 * _large_negative(q.dtype)
    residual = jnp.where(gone, _LARGE_NEGATIVE, lse).astype(k.dtype)
    return out, jnp.reshape(residual, output_shape[:-1])


def _installed_dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None,
                                     is_causal=False, query_seq_lengths=None,
                                     key_value_seq_lengths=None, local_window_size=None,
                                     implementation=None, return_residual=False):
    """jax.nn.dot_product_attention after fusedattn.install(): fusedattn's engine for
    every implementation hint (None, "xla", "cudnn"); other hints raise as jax's do."""
    if implementation not in (None, "xla", "cudnn"):
        raise ValueError(f"Unsupported implementation option: {implementation}")
    return dot_product_attention(
        query, key, value, bias, mask, scale=scale, is_causal=is_causal,
        query_seq_lengths=query_seq_lengths, key_value_seq_lengths=key_value_seq_lengths,
        local_window_size=local_window_size, return_residual=return_residual)


_installed_dot_product_attention._fusedattn_jax_original = _JAX_DOT_PRODUCT_ATTENTION


def install() -> None:
    """Make jax.nn.dot_product_attention run fusedattn's engine, whatever implementation
    hint its caller passes (Keras passes "xla", most code None). Idempotent."""
    jax.nn.dot_product_attention = _installed_dot_product_attention


def uninstall() -> None:
    """Put jax's own jax.nn.dot_product_attention back."""
    jax.nn.dot_product_attention = _JAX_DOT_PRODUCT_ATTENTION


def is_installed() -> bool:
    return jax.nn.dot_product_attention is _installed_dot_product_attention


@contextlib.contextmanager
def installed():
    """`with fusedattn.installed(): ...`: install() inside the block, and whatever
    jax.nn.dot_product_attention was before it afterwards."""
    before = jax.nn.dot_product_attention
    install()
    try:
        yield
    finally:
        jax.nn.dot_product_attention = before
