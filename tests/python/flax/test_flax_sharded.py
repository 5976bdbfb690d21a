"""fusedattn.flax MultiHeadAttention (linen and nnx) on a dp x cp x tp mesh of the 8 virtual CPU
devices, sharded by its logical axis names (batch -> dp, length -> cp with context
parallelism in the attention, heads -> tp): jit with those shardings equals the
single-device result (forward and gradients), and the parameters land sharded."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from conftest import normal
from fusedattn.flax import linen as fl

import flax_helpers as ref

pytestmark = pytest.mark.skipif(len(jax.devices("cpu")) < 8,
                                reason="needs 8 CPU devices (XLA_FLAGS, tests/python/conftest.py)")

RULES = (("batch", "dp"), ("length", "cp"), ("heads", "tp"), ("embed", None), ("kv", None),
         ("qkv", None))


@pytest.mark.parametrize("strategy", ["all_gather", "ring"])
def test_mesh_equals_one_device(strategy, key):
    kx, kd = jax.random.split(key)
    B, S, E = 4, 32, 32
    x, dy = normal(kx, (B, S, E)), normal(kd, (B, S, E))
    model = fl.MultiHeadAttention(num_attention_heads=4, num_gqa_groups=2,
                                  enable_rotary_pos_emb=True, softmax_type="learnable",
                                  context_parallel_axis="cp",
                                  context_parallel_strategy=strategy)
    boxed = model.init(jax.random.PRNGKey(0), x)
    params = nn.meta.unbox(boxed)
    params["params"]["attention"]["softmax_offset"] = normal(kd, (4,))

    def loss(p, x):
        return jnp.sum(model.apply(p, x) * dy)

    # One device, no mesh: the context-parallel axis is absent, the call is the plain one.
    want = jax.jit(model.apply)(params, x)
    want_g = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)

    mesh = Mesh(np.array(jax.devices("cpu")[:8]).reshape(2, 2, 2), ("dp", "cp", "tp"))
    shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, RULES)
    x_sharding = NamedSharding(mesh, P("dp", "cp", None))
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
        p_s = jax.device_put(params, shardings)
        x_s = jax.device_put(x, x_sharding)
        f = jax.jit(model.apply, in_shardings=(shardings, x_sharding), out_shardings=x_sharding)
        g = jax.jit(jax.grad(loss, argnums=(0, 1)), in_shardings=(shardings, x_sharding))
        out = f(p_s, x_s)
        grads = g(p_s, x_s)
        hlo = f.lower(p_s, x_s).compile().as_text()
    assert p_s["params"]["kv"].sharding.spec == P(None, None, "tp", None)
    assert p_s["params"]["out"].sharding.spec == P("tp", None, None)
    assert "fusedattn_attn_fwd" in hlo
    ref.assert_close("out", out, want)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(want_g)):
        ref.assert_close(jax.tree_util.keystr(path), a, b, rel=2e-5)


def test_nnx_mesh_equals_one_device(key):
    """nnx: the parameters' axis names -> nnx.get_partition_spec under the same rules."""
    from flax import nnx
    from fusedattn.flax import nnx as fn

    kx, kd = jax.random.split(key)
    x, dy = normal(kx, (4, 32, 32)), normal(kd, (4, 32, 32))
    model = fn.MultiHeadAttention(4, 32, num_gqa_groups=2, enable_rotary_pos_emb=True,
                                  context_parallel_axis="cp", rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    run = lambda st, x: nnx.merge(graphdef, st)(x)
    dx = lambda st, x: jax.grad(lambda x: jnp.sum(run(st, x) * dy))(x)
    want, want_dx = jax.jit(run)(state, x), jax.jit(dx)(state, x)

    mesh = Mesh(np.array(jax.devices("cpu")[:8]).reshape(2, 2, 2), ("dp", "cp", "tp"))
    with nn.logical_axis_rules(RULES):
        specs = nnx.get_partition_spec(state)
    st = jax.device_put(state, jax.tree.map(lambda s: NamedSharding(mesh, s), specs))
    xs = jax.device_put(x, NamedSharding(mesh, P("dp", "cp", None)))
    assert st["kernels"]["kv"][...].sharding.spec == P(None, None, "tp", None)
    out = jax.jit(run)(st, xs)
    assert out.sharding.spec[:2] == ("dp", "cp")
    ref.assert_close("out", out, want)
    ref.assert_close("dx", jax.jit(dx)(st, xs), want_dx, rel=2e-5)
