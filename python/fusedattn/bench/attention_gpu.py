"""python -m fusedattn bench attention (on a GPU): the GPU grid of docs/BENCH.md.

fused_attn (cuDNN graphs driven from C++, the forward the Hopper kernel's where
hopper/measured.h sends it: the "fwd" column names the kernel that ran) beside jax.nn.dot_product_attention with
implementation="cudnn" (XLA's own cuDNN fusion) and "xla", in the same run, bf16:
head dims 64/128/256, B*S = 16384 tokens with S in {1024, 4096, 16384}, H = 2048 / D,
causal and not, forward and forward+backward; plus GQA (Hq = 4 Hkv), THD packed
ragged sequences (jax's anchor: the same sequences padded, with seq lengths), a
sliding window of 256 and a post-scale bias [1, H, S, S] that takes no gradient (jax's
`bias=`; a constant, so fused_attn computes no dbias). The "fwd" column names the forward
kernel that ran, "bwd" (forward+backward rows) the backward's. TFLOP/s count the kept (query, key) pairs: 4*B*H*D per pair
(full: Sq*Skv, causal: S*(S+1)/2 ~ half), forward+backward 3.5x forward.
ratio = the jax cudnn anchor's time / ours (>= 1: we are faster).
Prints a table and a summary line; writes JSON and a PNG of the ratios (report.py), and
--plot PATH a PNG of the TFLOP/s.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import fusedattn
from fusedattn import AttnMaskType, QKVLayout, SequenceDescriptor, _lib

from . import report
from .common import copy_bandwidth, matmul_flops, run_info, time_fn


def _kept_pairs(S, causal, window=None):
    """Kept (query, key) pairs of one S x S head."""
    if window is not None:  # causal window (left, 0): row i keeps min(i, left) + 1 keys
        left = window
        return sum(min(i, left) + 1 for i in range(S))
    return S * (S + 1) // 2 if causal else S * S


def _case_list(args):
    cases = []
    for D in args.head_dims:
        H = 2048 // D
        for S in args.seqlens:
            for causal in (False, True):
                cases.append(dict(kind="mha", D=D, Hq=H, Hkv=H, S=S, B=args.tokens // S, causal=causal))
    D, H = 128, 16
    for S in (4096,):
        B = args.tokens // S
        cases.append(dict(kind="gqa", D=D, Hq=H, Hkv=H // 4, S=S, B=B, causal=True))
        cases.append(dict(kind="window256", D=D, Hq=H, Hkv=H, S=S, B=B, causal=True, window=256))
        cases.append(dict(kind="thd", D=D, Hq=H, Hkv=H, S=S, B=B, causal=True, segments=4))
        cases.append(dict(kind="bias", D=D, Hq=H, Hkv=H, S=S, B=B, causal=True))
    return cases


def _inputs(c, key):
    kq, kk, kv, kd = jax.random.split(key, 4)
    B, S, D = c["B"], c["S"], c["D"]
    n = lambda k, h: (jax.random.normal(k, (B, S, h, D), jnp.float32)).astype(jnp.bfloat16)
    return n(kq, c["Hq"]), n(kk, c["Hkv"]), n(kv, c["Hkv"]), n(kd, c["Hq"])


def _thd_lengths(c, rng):
    """Ragged segment lengths per row (summing to < S), their offsets, and the pairs kept."""
    B, S, M = c["B"], c["S"], c["segments"]
    lens = np.zeros((B, M), np.int32)
    for b in range(B):
        cuts = np.sort(rng.choice(np.arange(1, S - 64), M - 1, replace=False))
        edges = np.concatenate([[0], cuts, [S - 64]])  # a padded tail of 64 tokens
        lens[b] = np.diff(edges)
    offs = np.concatenate([np.zeros((B, 1), np.int32), np.cumsum(lens, 1)], 1).astype(np.int32)
    pairs = int(sum(l * (l + 1) // 2 for l in lens.ravel()))
    return lens, offs, pairs


def _impls(c, q, k, v, dout, thd=None):
    """name -> (fn, (q, k, v, dout)): each implementation with the inputs it runs on."""
    mask = AttnMaskType.CAUSAL_MASK if c["causal"] else AttnMaskType.NO_MASK
    window = (c["window"], 0) if "window" in c else None
    if thd is not None:
        lens, offs = thd
        sd = SequenceDescriptor.from_seqlens_and_offsets(jnp.asarray(lens), jnp.asarray(offs))

        def ours(q, k, v):
            return fusedattn.fused_attn((q, k, v), None, sd, None, qkv_layout=QKVLayout.THD_THD_THD,
                                        attn_mask_type=AttnMaskType.PADDING_CAUSAL_MASK,
                                        max_segments_per_seq=c["segments"])

        # jax has no packed layout: its anchor runs every segment as one padded sequence
        # of length S with its true length (B*M sequences), as a jax user without THD must.
        seg = jnp.asarray(lens.reshape(-1))
        n = lambda x: jnp.repeat(x, c["segments"], axis=0)

        def anchor(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn",
                                                query_seq_lengths=seg, key_value_seq_lengths=seg)
        return {"fusedattn": (ours, (q, k, v, dout)),
                "jax_cudnn": (anchor, (n(q), n(k), n(v), n(dout)))}

    # The bias row's bias goes in as an argument (after dout), the other rows have none.
    const = (_bias(c),) if c["kind"] == "bias" else ()

    def ours(q, k, v, *bias):
        return fusedattn.fused_attn((q, k, v), bias[0] if bias else None, None, None,
                                    attn_mask_type=mask, window_size=window,
                                    attn_bias_type=fusedattn.AttnBiasType.POST_SCALE_BIAS
                                    if bias else fusedattn.AttnBiasType.NO_BIAS)

    impls = {"fusedattn": (ours, (q, k, v, dout) + const)}
    for impl in ("cudnn", "xla"):
        def anchor(q, k, v, *bias, impl=impl):
            return jax.nn.dot_product_attention(q, k, v, bias=bias[0] if bias else None,
                                                is_causal=c["causal"], implementation=impl,
                                                local_window_size=window)
        impls[f"jax_{impl}"] = (anchor, (q, k, v, dout) + const)
    if window is None and not const:  # in float16: its bfloat16 path fails in jax 0.11.2 (a dtype mismatch)
        f16 = lambda x: x.astype(jnp.float16)
        impls["pallas_mgpu"] = (_pallas_mgpu(c), (f16(q), f16(k), f16(v), f16(dout)))
    return impls


def _bias(c):
    """The bias row's [1, H, S, S] bf16 bias (added after the scale, as jax's `bias=`)."""
    shape = (1, c["Hq"], c["S"], c["S"])
    return jax.random.normal(jax.random.PRNGKey(7), shape, jnp.float32).astype(jnp.bfloat16)


def _pallas_mgpu(c):
    """jax's Pallas Mosaic GPU attention (jax.experimental.pallas.ops.gpu.attention_mgpu,
    sm_90): blocks of 64 queries x 128 keys (64 keys past head dim 128, whose 128-key blocks
    exceed shared memory when compiled), two stages, its backward's blocks the same; it takes
    no scale (1, which changes no timing) and has no causal backward (the row records its
    error)."""
    from jax.experimental.pallas.ops.gpu import attention_mgpu as mgpu
    bkv = 128 if c["D"] <= 128 else 64
    cfg = mgpu.TuningConfig(block_q=64, block_kv=bkv, max_concurrent_steps=2, causal=c["causal"],
                            block_q_dkv=64, block_kv_dkv=bkv, block_q_dq=64, block_kv_dq=bkv)

    def run(q, k, v):
        return mgpu.attention(q, k, v, cfg)
    return run


def _fwd_bwd(f):
    # (args past dout: constants of the call, the bias row's bias: jit arguments, not
    # literals folded into the program, which a [1, H, S, S] bias would make minutes to compile)
    def loss(q, k, v, dout, *const):
        return jnp.sum(f(q, k, v, *const).astype(jnp.float32) * dout.astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2))


def run(args):
    rng = np.random.default_rng(0)
    rows = []
    for i, c in enumerate(_case_list(args)):
        q, k, v, dout = _inputs(c, jax.random.PRNGKey(i))
        thd = None
        if c["kind"] == "thd":
            lens, offs, pairs = _thd_lengths(c, rng)
            thd = (lens, offs)
        else:
            pairs = _kept_pairs(c["S"], c["causal"], c.get("window"))
        for mode in args.modes:
            backward = mode == "fwd+bwd"
            flops = 4.0 * c["B"] * c["Hq"] * c["D"] * pairs * (3.5 if backward else 1.0)
            row = dict(c, mode=mode)
            for name, (f, inputs) in _impls(c, q, k, v, dout, thd).items():
                if name == "jax_xla" and c["S"] > args.xla_max_seq:
                    continue  # materializes B*H*S*S scores: out of memory or minutes
                fn = jax.jit(_fwd_bwd(f)) if backward else jax.jit(f)
                fargs = inputs if backward else inputs[:3] + inputs[4:]
                launches, bwd_launches = _lib.hopper_fwd_launches(), _lib.hopper_bwd_launches()
                try:
                    sec, _ = time_fn(fn, fargs, repeats=args.repeats)
                except Exception as e:  # an anchor that rejects the shape: say so in the row
                    row[f"{name}_error"] = str(e).splitlines()[0][:160]
                    continue
                row[f"{name}_ms"] = sec * 1e3
                row[f"{name}_tflops"] = flops / sec / 1e12
                if name == "fusedattn":  # the kernels that ran
                    row["fwd_kernel"] = ("hopper" if _lib.hopper_fwd_launches() > launches
                                         else "cudnn")
                    if backward:
                        row["bwd_kernel"] = ("hopper" if _lib.hopper_bwd_launches() > bwd_launches
                                             else "cudnn")
            if "jax_cudnn_ms" in row and "fusedattn_ms" in row:
                row["ratio"] = row["jax_cudnn_ms"] / row["fusedattn_ms"]
            if "jax_xla_ms" in row and "fusedattn_ms" in row:
                row["ratio_xla"] = row["jax_xla_ms"] / row["fusedattn_ms"]
            if "pallas_mgpu_ms" in row and "fusedattn_ms" in row:
                row["ratio_pallas"] = row["pallas_mgpu_ms"] / row["fusedattn_ms"]
            rows.append(row)
            print(_fmt(row), flush=True)
    return rows


_HEADER = (f"{'case':10} {'D':>4} {'S':>6} {'B':>3} {'causal':>6} {'mode':8} | {'ours TF/s':>9} | "
           f"{'cudnn TF/s':>10} {'xla TF/s':>8} {'pallas TF/s':>11} | {'ratio':>6} {'fwd':>6} {'bwd':>6}")


def _fmt(r):
    g = lambda k: f"{r[k]:.0f}" if k in r else "-"
    ratio = f"{r['ratio']:.3f}" if "ratio" in r else "-"
    return (f"{r['kind']:10} {r['D']:4d} {r['S']:6d} {r['B']:3d} {str(r['causal']):>6} {r['mode']:8} | "
            f"{g('fusedattn_tflops'):>9} | {g('jax_cudnn_tflops'):>10} {g('jax_xla_tflops'):>8}"
            f" {g('pallas_mgpu_tflops'):>11} | {ratio:>6}"
            f" {r.get('fwd_kernel', '-'):>6} {r.get('bwd_kernel', '-'):>6}")


def _plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=True)
    for ax, mode in zip(axes, ("fwd", "fwd+bwd")):
        sel = [r for r in rows if r["mode"] == mode]
        labels = [f"{r['kind']} D{r['D']} S{r['S']}{' c' if r['causal'] else ''}" for r in sel]
        x = np.arange(len(sel))
        for j, (name, color) in enumerate((("fusedattn", "C0"), ("jax_cudnn", "C1"), ("jax_xla", "C2"),
                                           ("pallas_mgpu", "C3"))):
            ax.bar(x + (j - 1.5) * 0.2, [r.get(f"{name}_tflops", 0) for r in sel], 0.2, label=name,
                   color=color)
        ax.set_xticks(x, labels, rotation=90, fontsize=7)
        ax.set_title(f"bf16 attention, {mode}")
        ax.set_ylabel("TFLOP/s")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusedattn bench attention", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=16384, help="B * S")
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    p.add_argument("--xla-max-seq", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--plot", help="also write a PNG of the TFLOP/s here")
    report.add_output_args(p)
    args = p.parse_args(argv)
    info = run_info()
    info["copy_tbps"] = copy_bandwidth() / 1e12
    info["matmul_tflops"] = matmul_flops() / 1e12
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    print(_HEADER)
    rows = run(args)
    if args.plot:
        _plot(rows, args.plot)
        print(f"plot (TFLOP/s): {args.plot}")
    summary = report.summarize(rows, RATIOS)
    if "fusedattn vs jax cudnn" in summary:  # bench/RESULTS.md's figures
        info["ratio_geomean"] = summary["fusedattn vs jax cudnn"]["geomean"]
        info["ratio_min"] = summary["fusedattn vs jax cudnn"]["min"]
    report.finish("attention", args, dict(info=info, rows=rows), rows, RATIOS, _label)
    return 0


RATIOS = {"fusedattn vs jax cudnn": "ratio", "fusedattn vs jax xla": "ratio_xla",
          "fusedattn vs pallas mgpu": "ratio_pallas"}


def _label(r) -> str:
    return f"{r['kind']} D{r['D']} S{r['S']}{' causal' if r['causal'] else ''} {r['mode']}"
