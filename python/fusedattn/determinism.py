"""Deterministic mode: a bitwise repeatable attention backward on the GPU.

An attention backward sums dQ over key blocks. By default fusedattn's GPU kernels add each
block's part to a float32 accumulator with atomics as the blocks finish, so dq (and, in the
CUDA flash kernels, dbias, d softmax_offset and the score_mod operands' gradients) may
differ in the last bits from one run to the next. In deterministic mode a call's backward
is bitwise repeatable:

- the Hopper flash backward (sm_90, bf16 / fp16, head dims 64, 128 and 256) adds the dQ parts
  in key-block order (a counter per 64 query rows: O(S) memory) and takes every call it
  can run, whatever its speed table says;
- cuDNN's backward runs with its deterministic algorithm (on sm_90, cuDNN 9.19 writes dP
  to a [B, H, Sq, Skv] 16-bit workspace for it);
- the CUDA flash kernels have no deterministic backward: the backward of a call only they
  serve raises NotImplementedError when it is traced (get_backend names it "none").

The forward kernels, the CPU engine, fused_attn_small_seq and the softmax kernels are
deterministic in either mode. The cost (bench/RESULTS.md, "Deterministic backward") is why
the mode is off by default.

The mode is on when set_deterministic(True) or `with deterministic():` says so, else when
the environment asks: FUSEDATTN_DETERMINISTIC=1, TransformerEngine's
NVTE_ALLOW_NONDETERMINISTIC_ALGO=0, or XLA_FLAGS holding
--xla_gpu_deterministic_ops=true (or --xla_gpu_exclude_nondeterministic_ops=true). A call
reads it when it is traced (fused_attn's forward; its backward follows the forward's), so
a compiled function keeps the mode it was traced in, and so does a function jax has traced
before (jax caches traces by the function, not by this mode): set the mode before the
first call of the step function.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re

__all__ = ["deterministic", "is_deterministic", "set_deterministic"]

_override: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "fusedattn_deterministic", default=None)

_XLA_FLAG = re.compile(
    r"--xla_gpu_(?:deterministic_ops|exclude_nondeterministic_ops)(?:=(\S+))?(?:\s|$)")


def _from_environment() -> bool:
    if os.environ.get("FUSEDATTN_DETERMINISTIC", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    if os.environ.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "").strip() == "0":
        return True
    for m in _XLA_FLAG.finditer(os.environ.get("XLA_FLAGS", "")):
        if (m.group(1) or "true").lower() in ("true", "1"):
            return True
    return False


def is_deterministic() -> bool:
    """Whether calls traced now get a bitwise repeatable backward."""
    on = _override.get()
    return _from_environment() if on is None else on


def _check(enabled, where: str):
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"{where}: enabled must be a bool or None (the environment's "
                        f"setting); got {type(enabled).__name__}")


def set_deterministic(enabled: bool | None) -> None:
    """Turns deterministic mode on or off for calls traced from now on (in this context);
    None returns to the environment's setting."""
    _check(enabled, "set_deterministic")
    _override.set(enabled)


@contextlib.contextmanager
def deterministic(enabled: bool = True):
    """Deterministic mode on (or off) for the calls traced inside the block."""
    _check(enabled, "deterministic")
    token = _override.set(enabled)
    try:
        yield
    finally:
        _override.reset(token)
