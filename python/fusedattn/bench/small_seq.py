"""python -m fusedattn bench small_seq: small-sequence cross attention, bytes-based.

Grid (docs/BENCH.md): B = 30720 segments, one query each, Skv in {2, 4, 8, 16} keys,
H = 8, D in {128, 256, 512}, bf16, forward and forward+backward; a small grid on the CPU.
Beside fusedattn.fused_attn_small_seq (THD with cu_seqlens, and BSHD) it times, in the
same run on the same device, jax.nn.dot_product_attention with implementation="xla" and
"cudnn" (a rejection is recorded with its message) and fusedattn.fused_attn (whatever
backend it picks there; get_backend's name is recorded).

Bytes (every tensor read once, written once): forward q, k, v read + out written;
backward q, k, v, out, dout read + dq, dk, dv written; "fwd+bwd" counts both. GB/s (TB/s in
the JSON) = bytes / median time; "of copy" = that over the device copy bandwidth measured in this
run (bf16 x + 1, bytes read + written). Timing: time_pipelined below (common.py's method).
Prints a table and a summary line; writes JSON and a PNG of the ratios (report.py).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnMaskType, QKVLayout, SmallSeqDescriptor

from . import report
from .common import run_info

IMPLS = ("small_seq_thd", "small_seq_bshd", "xla", "cudnn", "fused_attn")


def byte_count(B, Skv, H, D, itemsize, mode):
    q = o = B * H * D * itemsize
    kv = B * Skv * H * D * itemsize
    fwd = q + 2 * kv + o
    bwd = (q + 2 * kv + o + o) + (q + 2 * kv)  # q, k, v, out, dout read; dq, dk, dv written
    return fwd if mode == "fwd" else fwd + bwd


def make_inputs(B, Skv, H, D, dtype, seed=0):
    """BSHD q [B, 1, H, D], k/v [B, Skv, H, D], dout like q; random normal (logits O(1))."""
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(ks[0], (B, 1, H, D), jnp.float32).astype(dtype)
    k = jax.random.normal(ks[1], (B, Skv, H, D), jnp.float32).astype(dtype)
    v = jax.random.normal(ks[2], (B, Skv, H, D), jnp.float32).astype(dtype)
    dout = jax.random.normal(ks[3], (B, 1, H, D), jnp.float32).astype(dtype)
    return q, k, v, dout


def impl_fns(B, Skv, H, D):
    """name -> (function of (q, k, v, extra) in BSHD shapes, extra args)."""
    cu_q = jnp.arange(B + 1, dtype=jnp.int32)
    cu_kv = jnp.arange(B + 1, dtype=jnp.int32) * Skv
    thd_sd = SmallSeqDescriptor.from_cu_seqlens(cu_q, cu_kv, max_segment_seqlen_kv=Skv)

    def small_seq_thd(q, k, v, sd):
        # The packed layout of the workload: [T, H, D] with cumulative offsets.
        out = fusedattn.fused_attn_small_seq(
            (q.reshape(B, H, D), k.reshape(B * Skv, H, D), v.reshape(B * Skv, H, D)), None, sd,
            None, attn_mask_type=AttnMaskType.PADDING_MASK, qkv_layout=QKVLayout.THD_THD_THD)
        return out.reshape(B, 1, H, D)

    def small_seq_bshd(q, k, v, _):
        return fusedattn.fused_attn_small_seq((q, k, v), None, None, None,
                                              attn_mask_type=AttnMaskType.NO_MASK,
                                              qkv_layout=QKVLayout.BSHD_BSHD_BSHD)

    def xla(q, k, v, _):
        return jax.nn.dot_product_attention(q, k, v, implementation="xla")

    def cudnn(q, k, v, _):
        return jax.nn.dot_product_attention(q, k, v, implementation="cudnn")

    def general(q, k, v, _):
        return fusedattn.fused_attn((q, k, v), None, None, None)

    return {"small_seq_thd": (small_seq_thd, thd_sd), "small_seq_bshd": (small_seq_bshd, None),
            "xla": (xla, None), "cudnn": (cudnn, None), "fused_attn": (general, None)}


def time_pipelined(fn, args, min_total_s=0.05, repeats=7):
    """common.time_fn's method (N back-to-back calls, one block at the end, median of
    repeats), keeping only the last call's outputs alive: at D = 512 one fwd+bwd call
    returns 8 GB of gradients, and N of them would not fit on the device."""
    jax.block_until_ready(fn(*args))  # compile + warm
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    n = max(1, int(min_total_s / max(time.perf_counter() - t0, 1e-6)))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = None
        for _ in range(n):
            out = fn(*args)  # the previous outputs are freed once their call has run
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t0) / n)
        del out
    return statistics.median(times)


def copy_bandwidth(nbytes, repeats=7):
    """Device copy bandwidth in bytes/s, bytes read + written (bf16 x -> x + 1), as
    common.copy_bandwidth measures it but timed by time_pipelined (its N outputs of
    1 GiB each would not fit)."""
    x = jax.random.normal(jax.random.PRNGKey(0), (nbytes // 2,), jnp.float32).astype(jnp.bfloat16)
    sec = time_pipelined(jax.jit(lambda x: x + jnp.bfloat16(1)), (x,), repeats=repeats)
    return 2 * x.size * 2 / sec


def timed(fn, extra, inputs, mode, repeats):
    q, k, v, dout = inputs
    if mode == "fwd":
        f = jax.jit(fn)
        args = (q, k, v, extra)
    else:
        def f(q, k, v, extra, dout):
            out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, extra), q, k, v)
            return vjp(dout)
        f = jax.jit(f)
        args = (q, k, v, extra, dout)
    return time_pipelined(f, args, repeats=repeats)


def run_grid(args):
    dtype = jnp.dtype(args.dtype)
    copy = copy_bandwidth(nbytes=args.copy_bytes)
    print(f"copy bandwidth (read + write): {copy / 1e9:.1f} GB/s", flush=True)
    general_backend = None
    rows = []
    for D in args.dims:
        for Skv in args.skvs:
            inputs = make_inputs(args.batch, Skv, args.heads, D, dtype)
            fns = impl_fns(args.batch, Skv, args.heads, D)
            if general_backend is None:
                general_backend = fusedattn.get_backend(inputs[:3]).name
            for mode in args.modes:
                nbytes = byte_count(args.batch, Skv, args.heads, D, dtype.itemsize, mode)
                row = dict(B=args.batch, H=args.heads, D=D, Skv=Skv, dtype=dtype.name,
                           mode=mode, bytes=nbytes, copy_tbps=copy / 1e12)
                for name in args.impls:
                    fn, extra = fns[name]
                    try:
                        sec = timed(fn, extra, inputs, mode, args.repeats)
                    except Exception as e:  # noqa: BLE001 - a rejection is a result here
                        row[f"{name}_error"] = str(e).strip().splitlines()[0][:160]
                        continue
                    row[f"{name}_us"] = sec * 1e6
                    row[f"{name}_tbps"] = nbytes / sec / 1e12
                    row[f"{name}_of_copy"] = nbytes / sec / copy
                if "small_seq_thd_us" in row:
                    for anchor in ("xla", "cudnn", "fused_attn"):
                        if f"{anchor}_us" in row:
                            row[f"thd_vs_{anchor}"] = row[f"{anchor}_us"] / row["small_seq_thd_us"]
                rows.append(row)
                print(fmt_row(row, args.impls), flush=True)
    return rows, copy, general_backend


def header(impls):
    cols = " | ".join(f"{n:>20}" for n in impls)
    return f"{'D':>4} {'Skv':>4} {'mode':8} | {cols} | {'thd/xla':>7}"


def fmt_row(r, impls):
    cells = []
    for n in impls:
        if f"{n}_tbps" in r:
            # GB/s: the CPU's figures are thousandths of a TB/s.
            cells.append(f"{1e3 * r[f'{n}_tbps']:7.1f} GB/s {100 * r[f'{n}_of_copy']:5.1f}%")
        else:
            cells.append(f"{'rejected' if f'{n}_error' in r else '-':>20}")
    ratio = f"{r['thd_vs_xla']:6.2f}x" if "thd_vs_xla" in r else f"{'-':>7}"
    return f"{r['D']:4d} {r['Skv']:4d} {r['mode']:8} | " + " | ".join(cells) + f" | {ratio}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusedattn bench small_seq", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    gpu = jax.default_backend() == "gpu"
    p.add_argument("--batch", type=int, default=30720 if gpu else 2048)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dims", type=int, nargs="+", default=[128, 256, 512] if gpu else [128])
    p.add_argument("--skvs", type=int, nargs="+", default=[2, 4, 8, 16] if gpu else [2, 16])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    p.add_argument("--impls", nargs="+", default=list(IMPLS) if gpu else
                   ["small_seq_thd", "small_seq_bshd", "xla", "fused_attn"], choices=IMPLS)
    p.add_argument("--repeats", type=int, default=7 if gpu else 5)
    p.add_argument("--copy-bytes", type=int, default=(1 << 30) if gpu else (1 << 28))
    report.add_output_args(p)
    args = p.parse_args(argv)

    info = run_info()
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    print(f"B={args.batch} segments, Sq=1, H={args.heads}, {args.dtype}; GB/s by bytes "
          "(fwd: q,k,v,o; bwd: q,k,v,o,do,dq,dk,dv), % of the copy bandwidth of this run; "
          "thd/xla = xla time / small_seq_thd time")
    print(header(args.impls))
    rows, copy, general = run_grid(args)
    print(f"fused_attn ran on backend: {general}")
    worst = {}
    for r in rows:
        if "small_seq_thd_of_copy" in r:
            worst[r["mode"]] = min(worst.get(r["mode"], 9.0), r["small_seq_thd_of_copy"])
    for mode, frac in worst.items():
        print(f"small_seq_thd {mode}: lowest fraction of copy bandwidth over the grid "
              f"{100 * frac:.1f}% (goal >= 90%)")
    report.finish("small_seq", args, dict(info=info, copy_bandwidth=copy,
                                          fused_attn_backend=general, rows=rows), rows,
                  {"small_seq vs jax xla": "thd_vs_xla", "small_seq vs jax cudnn": "thd_vs_cudnn",
                   "small_seq vs fused_attn": "thd_vs_fused_attn"},
                  lambda r: f"D{r['D']} Skv{r['Skv']} {r['mode']}")
    return 0
