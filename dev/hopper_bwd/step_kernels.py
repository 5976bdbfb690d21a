"""The kernels of one jitted fused_attn training step (jax.grad of sum(out * dout), tune_hopper.py's
step), each timed by Nsight Compute inside the step: where the Hopper backward's time goes
beside cuDNN's in a real step, and whether the kernel runs slower there than in bwd_time.

  ncu --clock-control none --cache-control none --profile-from-start off \
      --metrics gpu__time_duration.sum --csv python dev/hopper_bwd/step_kernels.py D S causal bwd [dist]

bwd: hopper or cudnn (the backward forced onto it; the forward keeps its measured choice);
dist: normal (jax's, default) or uniform (bwd_time's inputs: uniform in [-1, 1)). The region
profiled (cuProfilerStart / Stop) is REPS steps after a warm one; step_table.py reads ncu's CSV."""
import ctypes
import sys

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnMaskType, _lib

REPS = 3


def main():
    D, S, causal = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    bwd = sys.argv[4]
    dist = sys.argv[5] if len(sys.argv) > 5 else "normal"
    B, H = max(1, 16384 // S), 2048 // D
    ks = jax.random.split(jax.random.PRNGKey(S), 4)
    if dist == "uniform":
        make = lambda kk: jax.random.uniform(kk, (B, S, H, D), jnp.float32, -1.0, 1.0).astype(jnp.bfloat16)
    else:
        make = lambda kk: jax.random.normal(kk, (B, S, H, D), jnp.float32).astype(jnp.bfloat16)
    q, k, v, dout = (make(kk) for kk in ks)
    mask = AttnMaskType.CAUSAL_MASK if causal else AttnMaskType.NO_MASK
    attn = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=mask)
    loss = lambda q, k, v: jnp.sum(attn(q, k, v).astype(jnp.float32) * dout.astype(jnp.float32))
    fn = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    _lib.set_hopper_bwd({"hopper": "always", "cudnn": "off"}[bwd])
    before = _lib.hopper_bwd_launches()
    jax.block_until_ready(fn(q, k, v))  # compiled and warm before the region
    if (_lib.hopper_bwd_launches() > before) != (bwd == "hopper"):
        raise SystemExit(f"the backward did not run on {bwd}")
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuProfilerStart()
    for _ in range(REPS):
        jax.block_until_ready(fn(q, k, v))
    cuda.cuProfilerStop()
    print(f"step D {D} S {S} B {B} H {H} {'causal' if causal else 'full'} {dist} {bwd}-bwd: {REPS} steps")


main()
