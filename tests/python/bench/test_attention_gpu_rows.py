"""The GPU attention bench's rows (fusedattn/bench/attention_gpu.py) compare the same math:
run here on the CPU engine and XLA at a tiny size (the GPU runs them at the grid's)."""

import argparse

import jax
import numpy as np

from fusedattn.bench import attention_gpu


def test_the_grid_has_a_bias_row():
    args = argparse.Namespace(head_dims=[64], seqlens=[1024], tokens=16384)
    kinds = [c["kind"] for c in attention_gpu._case_list(args)]
    assert kinds.count("bias") == 1 and {"mha", "gqa", "window256", "thd"} <= set(kinds)


def test_bias_row_ours_and_jax_agree(key):
    """fused_attn with a POST_SCALE_BIAS and jax.nn.dot_product_attention(bias=) are the same
    attention (jax adds the bias after the scale); no Pallas anchor (it takes no bias)."""
    c = dict(kind="bias", D=32, Hq=2, Hkv=2, S=64, B=2, causal=True)
    q, k, v, dout = attention_gpu._inputs(c, key)
    impls = attention_gpu._impls(c, q, k, v, dout)
    assert set(impls) == {"fusedattn", "jax_cudnn", "jax_xla"}
    # the bias is an argument after dout (a jit argument, not a literal of the program)
    (f_ours, args_ours), (f_xla, args_xla) = impls["fusedattn"], impls["jax_xla"]
    assert len(args_ours) == 5 and args_ours[4].shape == (1, 2, 64, 64), [a.shape for a in args_ours]
    ours = f_ours(*args_ours[:3], *args_ours[4:])
    xla = f_xla(*args_xla[:3], *args_xla[4:])
    grads = [jax.jit(attention_gpu._fwd_bwd(f))(*a) for f, a in ((f_ours, args_ours), (f_xla, args_xla))]
    for g, w in zip(*grads):
        assert np.abs(np.asarray(g, np.float32) - np.asarray(w, np.float32)).max() < 5e-2
    err = np.abs(np.asarray(ours, np.float32) - np.asarray(xla, np.float32)).max()
    assert err < 3e-2, err
    # and not the same as without the bias: the row really adds it
    plain = attention_gpu._impls(dict(c, kind="mha"), q, k, v, dout)["jax_xla"][0](q, k, v)
    assert np.abs(np.asarray(plain, np.float32) - np.asarray(xla, np.float32)).max() > 0.1
