"""Thread count of the CPU engine: set_num_threads / num_threads, and what results may
depend on. The forward is bitwise independent of the thread count; the backward is bitwise
deterministic for a given thread count (attention_bwd.cc: dq partials are summed per chunk
in a fixed order) and agrees across counts within rounding."""

import jax
import jax.numpy as jnp
import numpy as np

import fusedattn
from conftest import fused, loss_fn, normal, qkv
from fusedattn import AttnMaskType

MASK = AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK


def grad_fn(key, dtype=jnp.float32):
    """jitted (dq, dk, dv) for q [2, 100, 4, 64], k/v [2, 150, 2, 64]: 12 kv-tile tasks."""
    kx, kd = jax.random.split(key)
    q, k, v = qkv(kx, 2, 100, 150, 4, 2, 64, dtype=dtype)
    loss = loss_fn(lambda q, k, v: fused(q, k, v, MASK), normal(kd, (2, 100, 4, 64), dtype))
    run = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    return lambda: [np.asarray(g, np.float32) for g in run(q, k, v)]


def assert_bitwise(got, expected, what):
    for name, a, b in zip(("dq", "dk", "dv"), got, expected):
        np.testing.assert_array_equal(a, b, err_msg=f"{name}: {what}")


def test_num_threads_reports_the_setting(set_threads):
    for n in (1, 3, 2):
        set_threads(n)
        assert fusedattn.num_threads() == n, f"set_num_threads({n})"


def test_forward_does_not_depend_on_thread_count(key, set_threads):
    q, k, v = qkv(key, 2, 130, 150, 4, 2, 64, dtype=jnp.bfloat16)
    run = jax.jit(lambda q, k, v: fused(q, k, v, AttnMaskType.CAUSAL_MASK))
    results = []
    for n in (1, 2, 4):
        set_threads(n)
        results.append(np.asarray(run(q, k, v), np.float32))
    for n, r in zip((2, 4), results[1:]):
        np.testing.assert_array_equal(r, results[0], err_msg=f"{n} threads vs 1")


def test_backward_is_deterministic_for_a_thread_count(key, set_threads):
    grads = grad_fn(key, jnp.bfloat16)
    results = {}
    for n in (1, 3, 3, 4, 4, 4):
        set_threads(n)
        got = grads()
        if n in results:
            assert_bitwise(got, results[n], f"two runs with {n} threads")
        results[n] = got
    for n in (3, 4):
        for name, a, b in zip(("dq", "dk", "dv"), results[n], results[1]):
            np.testing.assert_allclose(a, b, rtol=0, atol=2 ** -8 * max(1.0, np.abs(b).max()),
                                       err_msg=f"{name}: {n} threads vs 1")


def test_backward_bits_depend_only_on_the_current_thread_count(key, set_threads):
    # Going up to a count never used before in this process and back down must not change
    # the gradients computed with the lower count.
    grads = grad_fn(key)
    set_threads(2)
    before = grads()
    set_threads(fusedattn.num_threads() + 2)
    grads()
    set_threads(2)
    assert_bitwise(grads(), before, "2 threads, before and after a larger count was used")


def test_backward_with_broadcast_bias_is_deterministic(key, set_threads):
    # dbias of a broadcast bias is reduced by the tasks that own its plane, in a fixed order.
    from fusedattn import AttnBiasType
    kx, kd, kb = jax.random.split(key, 3)
    q, k, v = qkv(kx, 2, 100, 150, 4, 2, 64)
    bias = normal(kb, (1, 1, 100, 150))
    loss = lambda q, k, v, bias: jnp.sum(fusedattn.fused_attn(
        (q, k, v), bias, None, None, attn_bias_type=AttnBiasType.POST_SCALE_BIAS,
        attn_mask_type=MASK) * normal(kd, (2, 100, 4, 64)))
    run = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    set_threads(3)
    first = [np.asarray(g) for g in run(q, k, v, bias)]
    for _ in range(3):
        for name, a, b in zip(("dq", "dk", "dv", "dbias"), run(q, k, v, bias), first):
            np.testing.assert_array_equal(np.asarray(a), b, err_msg=name)
