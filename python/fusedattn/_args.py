"""Argument kinds, checked at trace time by every public entry point (fused_attn,
get_backend, dot_product_attention, the descriptors, softmax, fused_attn_small_seq).

Each message reads "<where>: <name> must be <allowed>; got <value>". The wrong kind of
argument (a list for an array, a string or a float for an int, a bool for a number, a
traced value for a static one) raises ArgumentTypeError, a TypeError that is also a
ValueError; a number that does not fit the engine's int64 / float32 fields raises
ValueError. Ranges are the engine's validate()'s to check (asked through _lib), so Python
and C++ never disagree on them.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class ArgumentTypeError(TypeError, ValueError):
    """The wrong kind of argument (a list for an array, a string for a number, a traced
    value for a static one). Also a ValueError, as these errors were before, so
    `except ValueError` (get_backend's "none" answer among them) keeps catching them."""


def got(value) -> str:
    if isinstance(value, (tuple, list)) and any(is_traced(x) for x in value):
        return "(" + ", ".join(got(x) for x in value) + ")"
    if is_traced(value):
        return f"a traced value {value.aval.str_short()} (under jit/grad/vmap)"
    if hasattr(value, "shape") and hasattr(value, "dtype") and not np.isscalar(value):
        return f"an array of shape {tuple(value.shape)} dtype {value.dtype}"
    text = repr(value)
    return f"{text[:60]}..." if len(text) > 60 else text


def is_traced(value) -> bool:
    return isinstance(value, jax.core.Tracer)


def is_bool(value) -> bool:
    return isinstance(value, (bool, np.bool_)) or getattr(value, "dtype", None) == np.bool_


def static_int(value, name: str, where: str, allowed: str = "a Python int") -> int:
    """A static int (Python or NumPy, or a concrete integer scalar array) that fits int64.
    Floats, bools, strings and traced values raise ArgumentTypeError; ints past int64
    raise ValueError (the engine checks the range itself)."""
    if is_bool(value) or is_traced(value) or isinstance(value, (float, np.floating)):
        raise ArgumentTypeError(f"{where}: {name} must be {allowed}; got {got(value)}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ArgumentTypeError(f"{where}: {name} must be {allowed}; got {got(value)}") from None
    if not INT64_MIN <= v <= INT64_MAX:
        raise ValueError(f"{where}: {name}={v} does not fit a 64-bit int; {name} must be "
                         f"{allowed}")
    return v


def static_float(value, name: str, where: str,
                 allowed: str = "a static real Python number") -> float:
    """A static real number (Python, NumPy, or a concrete real scalar array) that float32
    holds. Strings, bools, complex, None, arrays of other shapes and traced values raise
    ArgumentTypeError; a finite value past float32 raises ValueError. NaN and inf pass:
    the engine's validate() says what it allows."""
    dtype = getattr(value, "dtype", None)
    real = (isinstance(value, (int, float, np.integer, np.floating)) and not is_bool(value)) or (
        dtype is not None and getattr(value, "shape", None) == ()
        and (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)))
    if not real or is_traced(value):
        raise ArgumentTypeError(f"{where}: {name} must be {allowed}; got {got(value)}")
    try:
        f = float(value)
        past = math.isfinite(f) and abs(f) > _FLOAT32_MAX
    except OverflowError:  # a Python int past float64
        past = True
    except TypeError:  # e.g. a ShapeDtypeStruct: no value to read
        raise ArgumentTypeError(f"{where}: {name} must be {allowed}; got {got(value)}") from None
    if past:
        raise ValueError(f"{where}: {name}={got(value)} is past float32's range "
                         f"(|x| <= {_FLOAT32_MAX:.4g}); {name} must be finite")
    return f


def static_bool(value, name: str, where: str) -> bool:
    """True/False (Python or NumPy bool, a concrete bool scalar array, or the ints 0/1)."""
    if is_traced(value):
        raise ArgumentTypeError(f"{where}: {name} must be a static Python bool; got "
                                f"{got(value)}")
    if is_bool(value) and getattr(value, "shape", ()) == ():
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise ArgumentTypeError(f"{where}: {name} must be a Python bool (True or False); got "
                            f"{got(value)}")


def array(value, name: str, where: str, allowed: str = "an array"):
    """value itself when it is an array (jax.Array, numpy.ndarray, jax.ShapeDtypeStruct:
    anything with shape and dtype); a list, a Python number or None raises
    ArgumentTypeError, as jax.numpy's functions do."""
    if not (hasattr(value, "shape") and hasattr(value, "dtype")) or isinstance(value, type):
        hint = " (wrap it in jnp.asarray)" if isinstance(value, (list, tuple)) else ""
        raise ArgumentTypeError(f"{where}: {name} must be {allowed}; got "
                                f"{type(value).__name__}{hint}")
    return value


def scale_arg(value, name: str, where: str, head_dim: int) -> tuple[float, Any]:
    """scaling_factor -> (the static scale, None), or (1.0, the traced scalar) for a scale
    traced under jit/grad, which the caller folds into q (fold_scale). None means
    1/sqrt(head_dim) (1.0 for a head dim the engine will reject anyway)."""
    if value is None:
        return (head_dim ** -0.5 if head_dim > 0 else 1.0), None
    if is_traced(value):
        if value.shape != () or not (jnp.issubdtype(value.dtype, jnp.floating)
                                     or jnp.issubdtype(value.dtype, jnp.integer)):
            raise ArgumentTypeError(f"{where}: {name} must be a real scalar (a Python number "
                                    f"or a traced 0-d float array); got {got(value)}")
        return 1.0, value
    return static_float(value, name, where, "a real scalar (a Python number, or a traced "
                        "0-d float array)"), None


def fold_scale(x, scale, axis: int | None = None, index: int = 0):
    """x * scale (a traced scalar), rounded once to x's dtype. With axis, only x[..., index,
    ...] along axis is scaled (q inside a packed qkv tensor)."""
    factor = jnp.asarray(scale, jnp.float32)
    if axis is not None:
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        factor = jnp.ones((x.shape[axis],), jnp.float32).at[index].set(factor).reshape(shape)
    return (x.astype(jnp.float32) * factor).astype(x.dtype)
