"""python -m fusedattn bench cp_ring: context-parallel ring attention simulated on one device.

Context parallelism shards the S tokens over cp ranks. In the ring, at step s = 0..cp-1
rank r attends its queries to the K/V of rank (r - s) mod cp (passed on by ppermute) and
merges the partial (out, lse) by log-sum-exp. This builds the real schedule, times each
distinct sub-block call once with fused_attn (forward, and forward+backward by jax.grad;
common.time_fn) and adds the calls up as the ring would:
  rank step time = sum of its calls in that step; simulated = sum over steps of the slowest
  rank's step (every step waits for it); ideal = all ranks' work / cp;
  efficiency = ideal / simulated; balance = min rank total / max rank total;
  speedup = one S x S call on one device / simulated (cp at best: it also shows what
  smaller calls lose); calls = the most calls one rank makes over the ring.
Variants:
  dual         causal, load-balanced: 2cp chunks of C = S/(2cp), rank r holds chunks r and
               2cp-1-r (q and kv); each (q chunk, kv chunk) pair is one call: diagonal ->
               causal C x C, kv chunk before the q chunk -> unmasked, after it -> no call.
  dual-merged  the same work as one call per rank step (Megatron/TE's way): step 0 one causal
               2C x 2C, later steps 2C x C (source rank below r) or C x 2C (above), unmasked.
  contig       causal, rank r holds the contiguous chunk r of S/cp (unbalanced).
  full         no mask, contiguous chunks: one S/cp x S/cp call per step.
Communication: per step a rank sends its K and V block (2 * S/cp * Hkv * D * 2 bytes, bf16)
at NVLINK_GBPS per direction; the backward ring sends K, V, dK and dV (twice that), set
against the backward's step compute (each call's fwd+bwd time less its fwd time). fits: the
send hides under the shortest sending step's compute (the last step sends nothing); with
comm: every sending step lasts max(compute, send).
The log-sum-exp merge is not in the simulated times: it is timed on its own (one
elementwise jit over a rank's S/cp query rows, once per step) and shown beside them.
Prints a table for fwd and one for fwd+bwd and a summary line (speedup over one S x S call,
efficiency); writes JSON (--out / --json) and a PNG (report.py).
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp

import fusedattn
from fusedattn import AttnMaskType

from . import report
from .common import matmul_flops, run_info, time_fn

NVLINK_GBPS = 450.0  # H100 SXM NVLink 4: 450 GB/s per direction (900 GB/s both ways)
VARIANTS = ("dual", "dual-merged", "contig", "full")


# ---------------------------------------------------------------------------
# The schedule (pure: no timing). A chunk is (first token, length).


@dataclasses.dataclass(frozen=True)
class Block:
    """One attention call of a rank step: its q chunks against its kv chunks, each list
    concatenated in token order; causal: a top-left causal mask on the concatenation (exact
    when q and kv are the same ascending chunks: keys keep their order)."""
    q: tuple
    kv: tuple
    causal: bool

    @property
    def shape(self):
        return sum(n for _, n in self.q), sum(n for _, n in self.kv), self.causal


def rank_chunks(S: int, cp: int, variant: str) -> list[tuple]:
    """The chunks (of q, and of kv) each rank holds, ascending."""
    if variant.startswith("dual"):
        C = S // (2 * cp)
        return [((r * C, C), ((2 * cp - 1 - r) * C, C)) for r in range(cp)]
    L = S // cp
    return [((r * L, L),) for r in range(cp)]


def pair_kind(qc, kc, causal: bool) -> str:
    """'full', 'causal' (the diagonal) or 'empty' for a q chunk against a kv chunk."""
    (qs, qn), (ks, kn) = qc, kc
    if not causal or ks + kn <= qs:
        return "full"
    if (ks, kn) == (qs, qn):
        return "causal"
    assert ks >= qs + qn, (qc, kc)  # chunks of one length never overlap in part
    return "empty"


def step_blocks(q_chunks, kv_chunks, causal: bool, merge: bool) -> list[Block]:
    """The calls of one rank step: one per kept (q chunk, kv chunk) pair, or (merge) one
    call where the kept pairs make one causal square or one unmasked rectangle."""
    kept = {(a, b): k for a in q_chunks for b in kv_chunks
            if (k := pair_kind(a, b, causal)) != "empty"}
    if not kept:
        return []
    if merge:
        if causal and q_chunks == kv_chunks and list(q_chunks) == sorted(q_chunks):
            return [Block(tuple(q_chunks), tuple(kv_chunks), True)]
        qs = tuple(a for a in q_chunks if any(a == x for x, _ in kept))
        ks = tuple(b for b in kv_chunks if any(b == y for _, y in kept))
        if all(k == "full" for k in kept.values()) and len(kept) == len(qs) * len(ks):
            return [Block(qs, ks, False)]
    return [Block((a,), (b,), k == "causal") for (a, b), k in kept.items()]


def schedule(S: int, cp: int, variant: str) -> list[list[list[Block]]]:
    """[rank][step] -> the Blocks rank r computes at step s, against rank (r - s) mod cp's kv."""
    assert variant in VARIANTS and S % (2 * cp) == 0, (variant, S, cp)
    chunks = rank_chunks(S, cp, variant)
    return [[step_blocks(chunks[r], chunks[(r - s) % cp], variant != "full",
                         variant == "dual-merged") for s in range(cp)] for r in range(cp)]


def ring_stats(step_times, comm_s: float = 0.0) -> dict:
    """step_times [rank][step] seconds, comm_s the send of one step -> the ring's figures."""
    cp = len(step_times)
    steps = [max(t[s] for t in step_times) for s in range(cp)]
    totals = [sum(t) for t in step_times]
    sim, ideal = sum(steps), sum(totals) / cp
    sending = steps[:-1] or [float("inf")]
    return dict(simulated_s=sim, ideal_s=ideal, efficiency=ideal / sim if sim else 1.0,
                balance=min(totals) / max(totals) if max(totals) else 1.0, step_s=steps,
                comm_s=comm_s, min_step_s=min(sending), fits=comm_s <= min(sending),
                with_comm_s=sum(max(t, comm_s) for t in steps[:-1]) + steps[-1])


def kv_bytes(S: int, cp: int, Hkv: int, D: int, itemsize: int = 2) -> int:
    """What one rank sends per forward step: its K and V blocks."""
    return 2 * (S // cp) * Hkv * D * itemsize


# ---------------------------------------------------------------------------
# Timing


class Timer:
    """Seconds per call of fused_attn, by (Sq, Skv, causal, mode), each timed once."""

    def __init__(self, B, H, Hkv, D, dtype, repeats):
        self.dims, self.dtype, self.repeats, self.cache = (B, H, Hkv, D), dtype, repeats, {}

    def __call__(self, shape, mode):
        key = (*shape, mode)
        if key not in self.cache:
            self.cache[key] = self._time(*key)
        return self.cache[key]

    def _time(self, Sq, Skv, causal, mode):
        B, H, Hkv, D = self.dims
        ks = jax.random.split(jax.random.PRNGKey(Sq * 31 + Skv), 4)
        n = lambda k, s, h: jax.random.normal(k, (B, s, h, D), jnp.float32).astype(self.dtype)
        q, k, v, dout = n(ks[0], Sq, H), n(ks[1], Skv, Hkv), n(ks[2], Skv, Hkv), n(ks[3], Sq, H)
        mask = AttnMaskType.CAUSAL_MASK if causal else AttnMaskType.NO_MASK
        f = lambda q, k, v: fusedattn.fused_attn((q, k, v), None, None, None, attn_mask_type=mask)
        if mode == "fwd":
            return time_fn(jax.jit(f), (q, k, v), repeats=self.repeats)[0]
        loss = lambda q, k, v, d: jnp.sum(f(q, k, v).astype(jnp.float32) * d.astype(jnp.float32))
        return time_fn(jax.jit(jax.grad(loss, (0, 1, 2))), (q, k, v, dout), repeats=self.repeats)[0]

    def calls(self):
        B, H, _, D = self.dims
        out = []
        for (Sq, Skv, causal, mode), sec in sorted(self.cache.items()):
            pairs = Sq * (Sq + 1) / 2 if causal else Sq * Skv
            flops = 4.0 * B * H * D * pairs * (3.5 if mode == "fwd+bwd" else 1.0)
            out.append(dict(Sq=Sq, Skv=Skv, causal=causal, mode=mode, ms=sec * 1e3,
                            tflops=flops / sec / 1e12))
        return out


def merge_time(B, H, D, rows, repeats) -> float:
    """One log-sum-exp merge of a partial (out bf16, lse) into the f32 accumulators."""
    ks = jax.random.split(jax.random.PRNGKey(7), 4)
    o_acc, o = (jax.random.normal(k, (B, rows, H, D), jnp.float32) for k in ks[:2])
    l_acc, l = (jax.random.normal(k, (B, H, rows), jnp.float32) for k in ks[2:])

    def merge(o_acc, l_acc, o, l):
        m = jnp.logaddexp(l_acc, l)
        w = lambda x: jnp.swapaxes(jnp.exp(x - m), 1, 2)[..., None]
        return o_acc * w(l_acc) + o.astype(jnp.float32) * w(l), m
    return time_fn(jax.jit(merge), (o_acc, l_acc, o.astype(jnp.bfloat16), l), repeats=repeats)[0]


def _ms(x):
    """Seconds (in nested lists) -> milliseconds; other values unchanged."""
    if isinstance(x, list):
        return [_ms(y) for y in x]
    return x * 1e3 if isinstance(x, float) else x


def run(args):
    timer = Timer(args.batch, args.heads, args.kv_heads, args.head_dim, jnp.bfloat16, args.repeats)
    rows = []
    for S in args.seqlens:
        for cp in args.cp:
            if S % (2 * cp):
                continue
            merge_ms = merge_time(args.batch, args.heads, args.head_dim, S // cp, args.repeats) * 1e3
            comm = kv_bytes(S, cp, args.kv_heads, args.head_dim) / (args.nvlink_gbps * 1e9)
            for variant in args.variants:
                sched = schedule(S, cp, variant)
                t = {m: [[sum(timer(b.shape, m) for b in blocks) for blocks in steps]
                         for steps in sched] for m in ("fwd", "fwd+bwd")}
                bwd = [[max(fb - f, 0.0) for f, fb in zip(*rs)] for rs in zip(t["fwd"], t["fwd+bwd"])]
                fwd, fb, b = ring_stats(t["fwd"], comm), ring_stats(t["fwd+bwd"]), ring_stats(bwd, 2 * comm)
                # fwd+bwd: the backward ring's send (K, V, dK, dV) against its own steps.
                fb.update(comm_s=b["comm_s"], min_step_s=b["min_step_s"], fits=b["fits"],
                          with_comm_s=fwd["with_comm_s"] + b["with_comm_s"])
                calls = max(sum(len(bl) for bl in steps) for steps in sched)
                for mode, st in (("fwd", fwd), ("fwd+bwd", fb)):
                    single = timer((S, S, variant != "full"), mode)  # all of S on one device
                    rows.append(dict(S=S, cp=cp, variant=variant, mode=mode, calls_per_rank=calls,
                                     merge_ms=merge_ms, rank_step_ms=_ms(t[mode]),
                                     single_ms=single * 1e3, speedup=single / st["simulated_s"],
                                     **dict((k[:-2] + "_ms", _ms(v)) if k.endswith("_s") else (k, v)
                                           for k, v in st.items())))
            print(f"  S {S} cp {cp}: {len(timer.cache)} call shapes timed so far", flush=True)
    return rows, timer.calls()


_HEAD = (f"{'S':>6} {'cp':>2} {'variant':11} {'calls':>5} {'sim ms':>9} {'ideal ms':>9} {'eff %':>6} "
         f"{'balance':>7} {'speedup':>7} {'comm ms':>8} {'min step':>8} {'fits':>4} {'w/comm ms':>9} {'merge ms':>8}")


def _fmt(r):
    return (f"{r['S']:6d} {r['cp']:2d} {r['variant']:11} {r['calls_per_rank']:5d} "
            f"{r['simulated_ms']:9.3f} {r['ideal_ms']:9.3f} {100 * r['efficiency']:6.1f} "
            f"{r['balance']:7.3f} {r['speedup']:7.2f} {r['comm_ms']:8.3f} {r['min_step_ms']:8.3f} "
            f"{'yes' if r['fits'] else 'NO':>4} {r['with_comm_ms']:9.3f} {r['merge_ms']:8.3f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusedattn bench cp_ring", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqlens", type=int, nargs="+", default=[32768, 65536, 131072])
    p.add_argument("--cp", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--nvlink-gbps", type=float, default=NVLINK_GBPS, help="per direction")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="S 4096, cp 2")
    p.add_argument("--smoke", action="store_true", help="CPU smoke: S 512, cp 2 4, H 2, D 64")
    report.add_output_args(p, "--out")
    args = p.parse_args(argv)
    if args.quick:
        args.seqlens, args.cp = [4096], [2]
    if args.smoke:
        args.seqlens, args.cp, args.heads, args.head_dim, args.repeats = [512], [2, 4], 2, 64, 2
    args.kv_heads = args.kv_heads or args.heads
    info = run_info()
    if info["backend"] == "gpu":
        info["matmul_tflops"] = matmul_flops() / 1e12
    info.update(B=args.batch, H=args.heads, Hkv=args.kv_heads, D=args.head_dim, dtype="bfloat16",
                nvlink_gbps=args.nvlink_gbps, merge="timed apart, not in simulated")
    print(" ".join(f"{k}={v}" for k, v in info.items()))
    rows, calls = run(args)
    for mode in ("fwd", "fwd+bwd"):
        send = "K,V" if mode == "fwd" else "bwd ring K,V,dK,dV vs bwd steps"
        print(f"\n{mode}: comm = {send} per step at {args.nvlink_gbps:g} GB/s; times in ms")
        print(_HEAD)
        for r in rows:
            if r["mode"] == mode:
                print(_fmt(r))
    print(f"\n{len(calls)} distinct calls timed")
    report.finish("cp_ring", args, dict(info=info, calls=calls, rows=rows), rows,
                  {"ring (simulated) vs one S x S call": "speedup",
                   "ring vs ideal (efficiency)": "efficiency"},
                  lambda r: f"S{r['S']} cp{r['cp']} {r['variant']} {r['mode']}")
    return 0
