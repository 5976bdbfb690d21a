"""Deterministic mode's switches (fusedattn.determinism): the environment's three ways
(fusedattn's, TransformerEngine's, XLA's), set_deterministic and the context manager, read
when a call is traced and carried to its backward (the handler's backend_flags); the CPU
engine's gradients are bitwise repeatable in either mode. The GPU kernels:
test_determinism_gpu.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fusedattn
from fusedattn import AttnMaskType, _lib
from conftest import qkv

_ENV = ("FUSEDATTN_DETERMINISTIC", "NVTE_ALLOW_NONDETERMINISTIC_ALGO", "XLA_FLAGS")


@pytest.fixture
def clean_env(monkeypatch):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    fusedattn.set_deterministic(None)
    yield monkeypatch
    fusedattn.set_deterministic(None)


@pytest.mark.parametrize("name,value,on", [
    ("FUSEDATTN_DETERMINISTIC", "1", True), ("FUSEDATTN_DETERMINISTIC", "true", True),
    ("FUSEDATTN_DETERMINISTIC", "0", False), ("FUSEDATTN_DETERMINISTIC", "", False),
    ("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0", True), ("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1", False),
    ("XLA_FLAGS", "--xla_gpu_deterministic_ops=true", True),
    ("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_gpu_deterministic_ops", True),
    ("XLA_FLAGS", "--xla_gpu_exclude_nondeterministic_ops=true --xla_dump_to=/tmp/x", True),
    ("XLA_FLAGS", "--xla_gpu_deterministic_ops=false", False),
    ("XLA_FLAGS", "--xla_gpu_deterministic_ops_extra=true", False),
])
def test_environment(clean_env, name, value, on):
    assert not fusedattn.is_deterministic()
    clean_env.setenv(name, value)
    assert fusedattn.is_deterministic() is on


def test_override_and_context(clean_env):
    clean_env.setenv("FUSEDATTN_DETERMINISTIC", "1")
    with fusedattn.deterministic(False):
        assert not fusedattn.is_deterministic()
        with fusedattn.deterministic():
            assert fusedattn.is_deterministic()
        assert not fusedattn.is_deterministic()
    assert fusedattn.is_deterministic()  # the environment's again
    fusedattn.set_deterministic(False)
    assert not fusedattn.is_deterministic()
    fusedattn.set_deterministic(None)
    assert fusedattn.is_deterministic()
    with pytest.raises(TypeError, match="set_deterministic: enabled must be a bool"):
        fusedattn.set_deterministic(1)
    with pytest.raises(TypeError, match="deterministic: enabled must be a bool"):
        with fusedattn.deterministic("yes"):
            pass


def _flags_in(text: str) -> list[int]:
    import re
    return [int(m) for m in re.findall(r"backend_flags = (-?\d+)", text)]


def test_mode_is_read_at_trace_and_reaches_the_backward(clean_env, key):
    """The flag reaches both handlers' backend_flags when the call is traced in the mode; a
    function traced outside it carries none. (jax caches a function's trace by the function:
    one traced in the mode keeps it, determinism.py says so; hence two functions here.)"""
    q, k, v = qkv(key, 2, 64, 64, 4, 2, 32)

    def grad():
        loss = lambda q, k, v: jnp.sum(fusedattn.fused_attn(
            (q, k, v), None, None, None, attn_mask_type=AttnMaskType.CAUSAL_MASK))
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))

    with fusedattn.deterministic():
        flags = _flags_in(grad().lower(q, k, v).as_text())
    assert len(flags) >= 2 and all(f & _lib.REQUEST_DETERMINISTIC for f in flags), flags
    flags = _flags_in(grad().lower(q, k, v).as_text())
    assert flags and not any(f & _lib.REQUEST_DETERMINISTIC for f in flags), flags


def test_cpu_gradients_are_bitwise_repeatable_either_way(clean_env, key):
    """The CPU engine sums every dQ part in order: the mode changes no bit."""
    q, k, v = qkv(key, 2, 200, 200, 4, 2, 64)
    loss = lambda q, k, v: jnp.sum(jnp.sin(fusedattn.fused_attn(
        (q, k, v), None, None, None, attn_mask_type=AttnMaskType.CAUSAL_MASK)))
    plain = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    with fusedattn.deterministic():
        g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        for _ in range(2):
            for a, b in zip(plain, g(q, k, v)):
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert fusedattn.get_backend((q, k, v), platform="cpu", is_training=True).name == "cpu_flash"
