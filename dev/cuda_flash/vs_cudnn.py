"""cuda_flash against cuDNN on the same 16-bit calls: forces the generic CUDA flash kernels
(as if cuDNN had rejected the call: REQUEST_CUDNN_REJECTED) and times them beside the
normal cuDNN route, forward and forward+backward, with the max difference of the outputs.

    source scripts/gpu_env.sh && $PY dev/cuda_flash/vs_cudnn.py [--dims 64 128] [--batch-seq 16384]
        [--seq 4096] [--heads 16] [--causal-only]

A side cuDNN does not serve (its backward past head dim 256) shows "-".
"""
import argparse
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


def _time(route, mask, q, k, v):
    force_cuda_flash(route == "flash")
    f, g = fns(mask)
    name = fusedattn.get_backend((q, k, v), None, None, 0, attn_mask_type=mask).name
    out = (name, np.asarray(f(q, k, v), np.float32), timeit(f, q, k, v))
    try:
        return out + (timeit(g, q, k, v, n=5),)
    except Exception as e:  # noqa: BLE001 -- a backward the route does not serve
        print(f"  [{route} backward: {str(e).splitlines()[0][:100]}]")
        return out + (float("nan"),)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch-seq", type=int, default=16384, help="B * S")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--causal-only", action="store_true")
    args = ap.parse_args()
    print(f"{'call':44s} {'flash fwd':>9s} {'cudnn fwd':>9s} {'ratio':>6s} {'flash f+b':>9s} "
          f"{'cudnn f+b':>9s} {'ratio':>6s} {'max|d out|':>10s}")
    masks = [AttnMaskType.CAUSAL_MASK] + ([] if args.causal_only else [AttnMaskType.NO_MASK])
    for dt in (jnp.bfloat16,):
        for D in args.dims:
            for mask in masks:
                B, S, H = max(args.batch_seq // args.seq, 1), args.seq, args.heads
                ks = jax.random.split(jax.random.PRNGKey(0), 3)
                q, k, v = (jax.random.normal(x, (B, S, H, D), jnp.float32).astype(dt) for x in ks)
                fl, cu = (_time(route, mask, q, k, v) for route in ("flash", "cudnn"))
                force_cuda_flash(False)
                d = float(np.max(np.abs(fl[1] - cu[1])))
                label = f"{jnp.dtype(dt).name} B{B} S{S} H{H} D{D} {mask.name}"
                print(f"{label:44s} {fl[2]:9.3f} {cu[2]:9.3f} {cu[2] / fl[2]:6.2f} {fl[3]:9.3f} "
                      f"{cu[3]:9.3f} {cu[3] / fl[3]:6.2f} {d:10.2e}  [{fl[0]} / {cu[0]}]", flush=True)


if __name__ == "__main__":
    main()
