"""One forced cuda_flash forward (bf16 causal B4 S4096 H16 D64, or float32 with --f32;
--shape B,S,H,D another; with --bwd its gradients), run a few times: a target for ncu /
compute-sanitizer.

    source scripts/gpu_env.sh && ncu -k regex:fwd_kernel -c 1 $PY dev/cuda_flash/one_call.py
    compute-sanitizer --tool memcheck $PY dev/cuda_flash/one_call.py --bwd --shape 2,200,4,384
"""
import os
import sys

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnMaskType

sys.path.insert(0, os.path.dirname(__file__))
from vs_cudnn import force_cuda_flash  # noqa: E402

force_cuda_flash()
dt = jnp.float32 if "--f32" in sys.argv else jnp.bfloat16
ks = jax.random.split(jax.random.PRNGKey(0), 3)
shape = (4, 4096, 16, 64)
if "--shape" in sys.argv:
    shape = tuple(int(x) for x in sys.argv[sys.argv.index("--shape") + 1].split(","))
q, k, v = (jax.random.normal(x, shape, jnp.float32).astype(dt) for x in ks)
f = jax.jit(lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, 0,
                                                 attn_mask_type=AttnMaskType.CAUSAL_MASK))
if "--bwd" in sys.argv:  # the backward too
    fwd = f
    f = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fwd(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))
for _ in range(3):
    jax.block_until_ready(f(q, k, v))
print("ok")
