"""The profiled region of the dev scripts timed kernel by kernel under Nsight Compute
(`ncu --profile-from-start off`, dev/ncu_kernels.sh): one warm call, then REPS calls between
cuProfilerStart and cuProfilerStop, so the CSV holds REPS copies of the call's kernels
(dev/hopper_bwd/step_table.py reads it)."""
import ctypes

import jax

REPS = 3


def profile(fn, args, reps=REPS):
    jax.block_until_ready(fn(*args))  # compiled and warm before the region
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuProfilerStart()
    for _ in range(reps):
        jax.block_until_ready(fn(*args))
    cuda.cuProfilerStop()
