"""cuda_flash against cuDNN on the same 16-bit calls: forces the generic CUDA flash kernels
(as if cuDNN had rejected the call: REQUEST_CUDNN_REJECTED) and times them beside the
normal cuDNN route, forward and forward+backward, with the max difference of the outputs.

    source scripts/gpu_env.sh && $PY dev/cuda_flash/vs_cudnn.py
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

import fusedattn
from fusedattn import AttnMaskType, _gpu_route, _lib, backends

sys.path.insert(0, os.path.dirname(__file__))
from probe import timeit  # noqa: E402

_orig = _gpu_route._gpu_choice


def _forced(*a, **kw):
    """_gpu_choice as if cuDNN had rejected the call (REQUEST_CUDNN_REJECTED)."""
    if len(a) >= 6:  # (fields, want_lse, want_max_logit, training, score_mod, flags)
        a = a[:5] + (a[5] | _lib.REQUEST_CUDNN_REJECTED,) + a[6:]
    else:
        kw["flags"] = kw.get("flags", 0) | _lib.REQUEST_CUDNN_REJECTED
    return _orig(*a, **kw)


def force_cuda_flash(on: bool = True):
    """Route every later trace to the CUDA flash kernels (on) or back to the normal choice."""
    _gpu_route._gpu_choice = backends._gpu_choice = _forced if on else _orig


def fns(mask):
    f = jax.jit(lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, 0, attn_mask_type=mask))
    g = jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2)))
    return f, g


def main():
    print(f"{'call':44s} {'flash fwd':>9s} {'cudnn fwd':>9s} {'ratio':>6s} {'flash f+b':>9s} "
          f"{'cudnn f+b':>9s} {'ratio':>6s} {'max|d out|':>10s}")
    for dt in (jnp.bfloat16,):
        for D in (64, 128):
            for mask in (AttnMaskType.CAUSAL_MASK, AttnMaskType.NO_MASK):
                B, S, H = 16384 // 4096, 4096, 16
                ks = jax.random.split(jax.random.PRNGKey(0), 3)
                q, k, v = (jax.random.normal(x, (B, S, H, D), jnp.float32).astype(dt) for x in ks)
                res = {}
                for route in ("cudnn", "flash"):
                    force_cuda_flash(route == "flash")
                    f, g = fns(mask)
                    name = fusedattn.get_backend((q, k, v), None, None, 0, attn_mask_type=mask).name
                    res[route] = (timeit(f, q, k, v), timeit(g, q, k, v, n=5),
                                  np.asarray(f(q, k, v), np.float32), name)
                force_cuda_flash(False)
                d = float(np.max(np.abs(res["flash"][2] - res["cudnn"][2])))
                label = f"{jnp.dtype(dt).name} B{B} S{S} H{H} D{D} {mask.name}"
                fl, cu = res["flash"], res["cudnn"]
                print(f"{label:44s} {fl[0]:9.3f} {cu[0]:9.3f} {cu[0] / fl[0]:6.2f} {fl[1]:9.3f} "
                      f"{cu[1]:9.3f} {cu[1] / fl[1]:6.2f} {d:10.2e}  [{fl[3]} / {cu[3]}]", flush=True)


if __name__ == "__main__":
    main()
