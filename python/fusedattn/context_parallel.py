"""Context parallelism: the sequence of an attention call sharded over a mesh axis.

fused_attn(..., context_parallel_axis="cp") shards q's sequence (and k / v's) over that
mesh axis; every device computes its queries' attention over all keys, by one of two
strategies, with JAX collectives only:

  ALL_GATHER  k and v are all-gathered over the axis; each device runs its queries against
              the whole sequence; the backward reduce-scatters dk / dv.
  RING        k / v blocks travel around the ring with lax.ppermute (the transfer for step
              s + 1 is issued before step s's attention, so XLA overlaps them); the partial
              (out, log-sum-exp) of each step merge in float32; a block the mask empties is
              skipped; the backward is a ring too, dk / dv travelling with their block back
              to its owner. No device ever holds the whole k / v.

Every block is an engine call of its own with global positions (the index_base operand's
q_pos / kv_pos / extents): masks (causal, bottom-right, windows, padding), dropout's
Philox counters and score_mod's q_idx / kv_idx are those of the unsharded call, so the
result equals the single-device one. The attention sink (softmax_offset) joins once, at
the merge; a bias and the score_mod operands stay whole over the axis (each block takes
its slice; their gradients are summed over it).

Causal load balancing (context_parallel_causal_load_balanced=True): the inputs come in
dual-chunk order (reorder_causal_load_balancing): the sequence cut into 2 cp chunks, device
r holding chunks r and 2 cp - 1 - r, so every device has the same causal work.
"""

from __future__ import annotations

import dataclasses
from enum import IntEnum
from typing import Callable

import jax
import jax.numpy as jnp

from . import reference
from . import score_mod as _sm
from ._args import ArgumentTypeError, static_bool, static_int
from ._partition import vary_like
from ._prepare import KV_PACKED, QKV_PACKED, unpack
from .enums import AttnBiasType, AttnMaskType, QKVLayout, SoftmaxType

__all__ = ["CPStrategy", "ReorderStrategy", "reorder_causal_load_balancing",
           "inverse_reorder_causal_load_balancing"]


class CPStrategy(IntEnum):
    """How context parallelism exchanges k / v (TransformerEngine's names)."""

    DEFAULT = 0  # ALL_GATHER
    ALL_GATHER = 1
    RING = 2


class ReorderStrategy(IntEnum):
    """How load balancing reorders a sequence over cp devices."""

    DualChunkSwap = 0  # 2 cp chunks, device r holds chunks r and 2 cp - 1 - r (BSHD)
    Striped = 1  # stripes of stripe_size tokens dealt round-robin to the devices (THD)


def _chunk_order(cp_size: int, strategy: ReorderStrategy, n_units: int) -> list[int]:
    """The natural unit indices in reordered order (units: 2 cp chunks or stripes)."""
    if strategy == ReorderStrategy.DualChunkSwap:
        return [c for r in range(cp_size) for c in (r, 2 * cp_size - 1 - r)]
    per = n_units // cp_size
    return [r + cp_size * i for r in range(cp_size) for i in range(per)]


def _reorder(x, strategy, cp_size: int, seq_dim: int, stripe_size, inverse: bool):
    where = ("inverse_" if inverse else "") + "reorder_causal_load_balancing"
    strategy = ReorderStrategy(strategy)
    if not isinstance(cp_size, int) or cp_size < 1:
        raise ValueError(f"{where}: cp_size must be a positive int; got {cp_size!r}")
    x = jnp.asarray(x)
    seq_dim = seq_dim % x.ndim
    S = x.shape[seq_dim]
    if strategy == ReorderStrategy.DualChunkSwap:
        unit, n_units = S // (2 * cp_size), 2 * cp_size
    else:
        if not isinstance(stripe_size, int) or stripe_size < 1:
            raise ValueError(f"{where}: stripe_size must be a positive int for Striped; got "
                             f"{stripe_size!r}")
        unit, n_units = stripe_size, S // stripe_size
    if unit == 0 or unit * n_units != S or n_units % cp_size:
        raise ValueError(f"{where}: the sequence dim {seq_dim} ({S}) must divide into "
                         f"{'2 * cp_size' if strategy == 0 else 'cp_size * stripe_size'} "
                         f"equal units (cp_size {cp_size}, stripe_size {stripe_size})")
    order = _chunk_order(cp_size, strategy, n_units)
    if inverse:
        inv = [0] * n_units
        for i, c in enumerate(order):
            inv[c] = i
        order = inv
    shape = x.shape[:seq_dim] + (n_units, unit) + x.shape[seq_dim + 1:]
    y = jnp.take(x.reshape(shape), jnp.asarray(order), axis=seq_dim)
    return y.reshape(x.shape)


def reorder_causal_load_balancing(tensor, strategy=ReorderStrategy.DualChunkSwap,
                                  cp_size: int = 1, seq_dim: int = 1, stripe_size=None):
    """tensor's sequence dim in load-balanced order: shard r (of cp_size contiguous
    shards) then holds dual chunks r and 2 cp - 1 - r (DualChunkSwap), or the stripes
    r, r + cp, r + 2 cp, .. of stripe_size tokens (Striped). Apply it to q, k, v, and to
    segment ids / positions [B, S] (seq_dim=1) alike."""
    return _reorder(tensor, strategy, cp_size, seq_dim, stripe_size, inverse=False)


def inverse_reorder_causal_load_balancing(tensor, strategy=ReorderStrategy.DualChunkSwap,
                                          cp_size: int = 1, seq_dim: int = 1,
                                          stripe_size=None):
    """The natural order back (the output of a load-balanced call, its gradients)."""
    return _reorder(tensor, strategy, cp_size, seq_dim, stripe_size, inverse=True)


@dataclasses.dataclass(frozen=True)
class CPConfig:
    """The static context-parallel arguments of a call."""

    axis: str
    strategy: CPStrategy
    load_balanced: bool
    stripe: int | None = None  # THD: striped load balancing's stripe_size


@dataclasses.dataclass(frozen=True)
class CPRun:
    """One call's context parallelism on a mesh: the axis, its size, the strategy."""

    axis: str
    size: int
    strategy: CPStrategy
    load_balanced: bool
    stripe: int | None = None  # THD striped: the stripe size (stride: size * stripe)
    thd: bool = False

    def rank(self):
        return jax.lax.axis_index(self.axis)

    def chunks(self, rank, S: int) -> list[tuple]:
        """(global position, length) of the chunks a device holds, in its local order; a
        THD device's tokens are one chunk, striped (its first token's position) or not."""
        n = self.size
        if self.thd:
            return [(rank * self.stripe if self.stripe else rank * (S // n), S // n)]
        if self.load_balanced:
            C = S // (2 * n)
            return [(rank * C, C), ((2 * n - 1 - rank) * C, C)]
        return [(rank * (S // n), S // n)]


def check_divisible(cp: CPRun, Sq: int, Skv: int, dropout: bool) -> None:
    """The sequence lengths a cp split needs (raised at partitioning time)."""
    units = cp.size * (2 if cp.load_balanced and not cp.thd else 1)
    how = ", load-balanced: 2 chunks each" if cp.load_balanced and not cp.thd else ""
    if cp.thd and cp.stripe:
        units, how = cp.size * cp.stripe, f", stripes of {cp.stripe} tokens"
    for name, S in (("q", Sq), ("k/v", Skv)):
        if S % units:
            raise ValueError(
                f"fused_attn: context parallelism over '{cp.axis}' ({cp.size} devices{how}) "
                f"needs the {name} sequence length ({S}) to be a multiple of {units}")
        if dropout and cp.thd and cp.stripe and cp.stripe % 4:
            raise ValueError(
                f"fused_attn: dropout under striped context parallelism needs a stripe_size "
                f"that is a multiple of 4 (dropout draws 4 keys per Philox counter); got "
                f"{cp.stripe}")
        if dropout and not (cp.thd and cp.stripe) and (S // units) % 4:
            raise ValueError(
                f"fused_attn: dropout under context parallelism needs chunks of a multiple of "
                f"4 tokens (dropout draws 4 keys per Philox counter); the {name} sequence "
                f"{S} over {units} chunks gives {S // units}")


# ---------------------------------------------------------------------------
# The algorithms. Operands are one device's BSHD shards without vmap dims:
# q [B, Sq_l, Hq, D], k / v [B, Skv_l, Hkv, D|Dv]; the rest as attention.py's ops. A block
# call goes through call_fwd(ops, cfg, dims, sm) / call_bwd(args, cfg, dims, sm), the
# per-device calls of attention.py.

NEG_INF = -jnp.inf


# Block modes: how a block's mask is given to the engine. "pos": the call's own mask at
# global positions (index_base's q_pos / kv_pos / extents: any mask, window, dropout,
# score_mod). Where positions cannot matter (no dropout, score_mod, window; no mask or a
# top-left causal one) a block is one of the plain calls every backend serves at full
# speed, chosen at run time: "none" (no mask: a causal block wholly below the diagonal),
# "causal" (a diagonal block: same positions for q and k), "upto" (the all-gather's
# queries at qp.. against every key: bottom-right causal over the first qp + cq keys,
# by the padding lengths), or skipped (wholly above the diagonal).


def _plain(cfg, dims, sm):
    """"none" / "causal" when the call's blocks can be plain calls, else None."""
    if cfg.dropout_on or sm is not None or tuple(cfg.window) != (-1, -1):
        return None
    mask = AttnMaskType(cfg.mask_type)
    if mask == AttnMaskType.NO_MASK:
        return "none"
    if mask == AttnMaskType.CAUSAL_MASK or (
            mask == AttnMaskType.CAUSAL_BOTTOM_RIGHT_MASK and dims.Sq == dims.Skv):
        return "causal"
    return None


@dataclasses.dataclass
class _Call:
    """What every block of one device's call shares."""

    cfg: object  # the blocks' Config (BSHD_BSHD_BSHD, lse wanted)
    dims: object  # global Dims (Sq, Skv global; B, heads local)
    sm: object  # local ScoreMod or None
    ops: list  # q, k, v, bias, offset, seed, q_lens, kv_lens, q_offs, kv_offs, index_base[, smo]
    cp: CPRun
    base: tuple  # (batch_base, head_base) traced int32
    sink_in_call: bool  # all-gather: each call sees every key, so it takes the sink
    plain: str | None  # _plain's answer

    def index_base(self, qp, kp):
        b0, h0 = self.base
        d = self.dims
        cols = [b0, h0, jnp.int32(qp), jnp.int32(kp), jnp.int32(d.Sq), jnp.int32(d.Skv)]
        if self.cp.thd and self.cp.stripe:  # local token t is global pos + (t / st) * n st + t % st
            cols += [jnp.int32(self.cp.stripe), jnp.int32(self.cp.size * self.cp.stripe)]
        return jnp.stack(cols).astype(jnp.int32)

    def block(self, q, k, v, qp, kp, mode):
        """(ops, cfg, dims, sm) of the block (q at global row qp, k / v at global key kp)
        in mode (above)."""
        o = self.ops
        cq, ck = q.shape[1], k.shape[1]
        bias = o[3]
        if bias.size:
            bias = jax.lax.dynamic_slice_in_dim(bias, qp, cq, axis=2)
            bias = jax.lax.dynamic_slice_in_dim(bias, kp, ck, axis=3)
        off = o[4] if self.sink_in_call else jnp.reshape(o[4], (-1,))[:0]
        seq, cfg = list(o[6:10]), self.cfg
        if mode == "pos":
            ib = self.index_base(qp, kp)
        else:
            ib = o[10][:0]
            mask = {"none": AttnMaskType.NO_MASK, "causal": AttnMaskType.CAUSAL_MASK,
                    "upto": AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK}[mode]
            cfg = dataclasses.replace(cfg, mask_type=mask)
            if mode == "upto":
                B = q.shape[0]
                seq[0] = jnp.full((B, 1), cq, jnp.int32)
                seq[1] = jnp.broadcast_to(jnp.int32(qp + cq), (B, 1))
        ops = [q, k, v, bias, off, o[5], *seq, ib]
        sm = self.sm
        if sm is not None and self.cp.thd:  # read by position in segment: whole
            ops.append(o[11])
        elif sm is not None:
            ops.append(self._sm_slice(qp, cq, kp, ck))
            sm = dataclasses.replace(sm, operand_shapes=self._sm_shapes(cq, ck))
        return ops, cfg, dataclasses.replace(self.dims, Sq=cq, Skv=ck), sm

    def real_rows(self, qp, cq):
        """bool [B, cq]: the chunk's queries that are in a sequence (not padding: they take
        the sink), or None when every query is (no padding mask, BSHD)."""
        mask = AttnMaskType(self.cfg.mask_type)
        if not (self.cp.thd or mask.is_padding()):
            return None
        o = self.ops
        block = self.index_base(qp, 0)[2:]
        tables = reference._segment_tables(mask, o[0].shape[0], cq, 1, o[6], o[7], o[8], o[9],
                                           self.cp.thd, block=block)
        return tables[4] >= 0

    def dispatch(self, qp, cq, kp, ck, run, skip, *refs):
        """run(mode) for this block (a traced choice among the plain modes, or "pos" under
        a cond that skips a block the mask empties); skip() gives empty results."""
        if self.plain is None:
            return _cond(_visible(self.cfg, self.dims, qp, cq, kp, ck), lambda: run("pos"),
                         skip, *refs)
        if self.plain == "none":
            return run("none")
        if isinstance(kp, int) and ck == self.dims.Skv:  # every key: the all-gather's queries
            return run("upto")
        empty = kp > qp + cq - 1
        below = kp + ck - 1 <= qp
        diag = jnp.logical_and(qp == kp, cq == ck)
        idx = jnp.where(empty, 0, jnp.where(below, 1, jnp.where(diag, 2, 3)))
        return jax.lax.switch(idx, [lambda: vary_like(tuple(skip()), *refs),
                                    lambda: run("none"), lambda: run("causal"),
                                    lambda: run("pos")])

    def _sm_shapes(self, cq, ck):
        return tuple((s[0], s[1], cq if s[2] > 1 else 1, ck if s[3] > 1 else 1)
                     for s in self.sm.operand_shapes)

    def sm_size(self, cq, ck):
        """The flat size of a block's score_mod operands."""
        if self.cp.thd:
            return self.ops[11].shape
        return _sm.concat_operands([jnp.zeros(s, jnp.float32)
                                    for s in self._sm_shapes(cq, ck)]).shape

    def _sm_slice(self, qp, cq, kp, ck):
        arrays = _sm.split_operands(self.ops[11], self.sm)
        cut = []
        for a in arrays:
            if a.shape[2] > 1:
                a = jax.lax.dynamic_slice_in_dim(a, qp, cq, axis=2)
            if a.shape[3] > 1:
                a = jax.lax.dynamic_slice_in_dim(a, kp, ck, axis=3)
            cut.append(a)
        return _sm.concat_operands(cut)

    def sm_place(self, dflat, qp, cq, kp, ck, acc):
        """acc (the global operands' gradient, float32 [N]) + a block's at its place."""
        if self.cp.thd:
            return acc + dflat
        local = dataclasses.replace(self.sm, operand_shapes=self._sm_shapes(cq, ck))
        out = []
        for a, g in zip(_sm.split_operands(acc, self.sm), _sm.split_operands(dflat, local)):
            start = (0, 0, qp if a.shape[2] > 1 else 0, kp if a.shape[3] > 1 else 0)
            cur = jax.lax.dynamic_slice(a, start, g.shape)
            out.append(jax.lax.dynamic_update_slice(a, cur + g, start))
        return _sm.concat_operands(out)

    def bias_place(self, dbias, qp, kp, acc):
        start = (0, 0, qp, kp)
        cur = jax.lax.dynamic_slice(acc, start, dbias.shape)
        return jax.lax.dynamic_update_slice(acc, cur + dbias.astype(jnp.float32), start)


def _block_call(cfg, dims, sm, ops, cp: CPRun, base) -> _Call:
    """The blocks take BSHD_BSHD_BSHD operands and give the lse; the ring's blocks see
    part of the keys each, so the sink joins at the merge instead."""
    partial = cp.strategy == CPStrategy.RING or cp.thd  # blocks see part of the keys
    layout = QKVLayout.THD_THD_THD if cp.thd else QKVLayout.BSHD_BSHD_BSHD
    bcfg = dataclasses.replace(cfg, want_lse=True, layout=layout, cp=None)
    if partial:
        bcfg = dataclasses.replace(bcfg, softmax_type=SoftmaxType.VANILLA_SOFTMAX)
    return _Call(bcfg, dims, sm, ops, cp, base, sink_in_call=not partial,
                 plain=None if cp.thd else _plain(cfg, dims, sm))


def _visible(cfg, dims, qp, cq, kp, ck):
    """Whether the mask keeps any key of the block (traced bool; True when it cannot be
    told without the runtime lengths). Causal masks set the right side to 0."""
    mask = AttnMaskType(cfg.mask_type)
    if mask == AttnMaskType.PADDING_CAUSAL_BOTTOM_RIGHT_MASK or cfg.thd:
        return True  # the diagonal depends on each row's lengths (THD: its segments)
    diag = dims.Skv - dims.Sq if mask.is_bottom_right() else 0
    left, right = cfg.window
    if mask.is_causal():
        right = 0
    vis = True
    if right >= 0:
        vis = jnp.logical_and(vis, kp <= qp + cq - 1 + diag + right)
    if left >= 0:
        vis = jnp.logical_and(vis, kp + ck - 1 >= qp + diag - left)
    return vis


def _cond(pred, run, skip, *refs):
    """run() where the block keeps a key, else skip() (typed varying like refs, as run's
    results are inside shard_map)."""
    if pred is True:
        return run()
    return jax.lax.cond(pred, run, lambda: vary_like(tuple(skip()), *refs))


def _merge(acc, part):
    """Two partial (out f32, lse) of the same rows over disjoint keys -> their union."""
    (o1, l1), (o2, l2) = acc, part
    lse = jnp.logaddexp(l1, l2)
    safe = jnp.where(jnp.isneginf(lse), 0.0, lse)
    w1 = jnp.where(jnp.isneginf(l1), 0.0, jnp.exp(l1 - safe))
    w2 = jnp.where(jnp.isneginf(l2), 0.0, jnp.exp(l2 - safe))
    t = lambda w: jnp.swapaxes(w, 1, 2)[..., None]  # [B, H, S] -> [B, S, H, 1]
    return o1 * t(w1) + o2.astype(jnp.float32) * t(w2), lse


def _sink(cfg, offset, H):
    """The per-head extra logit [H] of the call's softmax type, or None."""
    st = SoftmaxType(cfg.softmax_type)
    if st == SoftmaxType.VANILLA_SOFTMAX:
        return None
    if st == SoftmaxType.OFF_BY_ONE_SOFTMAX:
        return jnp.zeros((H,), jnp.float32)
    return jnp.reshape(offset, (-1,)).astype(jnp.float32)


def _add_sink(o, lse, sink, real=None):
    """The sink joins the denominator once: lse' = logaddexp(lse, sink), out rescaled;
    padding queries (real False [B, S]) keep lse -inf, as the engine gives them."""
    if sink is None:
        return o, lse
    s = sink[None, :, None]
    new = jnp.logaddexp(lse, s)
    if real is not None:
        new = jnp.where(real[:, None, :], new, lse)
    w = jnp.where(jnp.isneginf(lse), 0.0, jnp.exp(lse - jnp.where(jnp.isposinf(new), 0, new)))
    w = jnp.where(jnp.isposinf(new) & ~jnp.isposinf(lse), 0.0, w)
    return o * jnp.swapaxes(w, 1, 2)[..., None], new


def _ring_perm(n):
    return [(j, (j + 1) % n) for j in range(n)]


def _gather_natural(x, cp: CPRun):
    """all_gather of a sequence shard [B, S_l, ..] -> the whole sequence, natural order."""
    full = jax.lax.all_gather(x, cp.axis, axis=1, tiled=True)
    if not cp.load_balanced:
        return full
    return inverse_reorder_causal_load_balancing(full, ReorderStrategy.DualChunkSwap, cp.size)


def _scatter_natural(x, cp: CPRun):
    """The reverse: a whole-sequence gradient (natural order) summed over the axis, each
    device keeping its shard."""
    if cp.load_balanced:
        x = reorder_causal_load_balancing(x, ReorderStrategy.DualChunkSwap, cp.size)
    return jax.lax.psum_scatter(x, cp.axis, scatter_dimension=1, tiled=True)


def _split(x, chunks, axis: int = 1):
    """x's local sequence cut into the chunks' lengths (static)."""
    out, start = [], 0
    for _, n in chunks:
        out.append(jax.lax.slice_in_dim(x, start, start + n, axis=axis))
        start += n
    return out


def _steps(k, v, cp: CPRun, rank, S: int, gather: bool, carry, step, after=None, refs=()):
    """carry through step(chunks, ks, vs, carry) over the k / v blocks a device sees (each
    chunk (global position, length)); after(carry) follows every ring step. All-gather:
    one step, the whole sequence. Ring: cp steps in a loop (its buffers reused, so a
    device holds two k / v blocks, never the whole): step s's transfer of the next block
    is issued before its blocks are used, so XLA overlaps the two."""
    after = after or (lambda c: c)
    if gather and not cp.thd:
        return step([(0, S)], [_gather_natural(k, cp)], [_gather_natural(v, cp)], carry)
    if gather:  # THD: the gathered blocks one by one, each its rank's (striped) tokens
        kf = jax.lax.all_gather(k, cp.axis, axis=1, tiled=True)
        vf = jax.lax.all_gather(v, cp.axis, axis=1, tiled=True)
        L = k.shape[1]
        for j in range(cp.size):
            cut = lambda x: jax.lax.slice_in_dim(x, j * L, (j + 1) * L, axis=1)
            carry = after(step(cp.chunks(j, S), [cut(kf)], [cut(vf)], carry))
        return carry
    carry = jax.tree.map(lambda x: vary_like(x, *refs), carry)

    def one(s, kv, carry):
        chunks = cp.chunks((rank - s) % cp.size, S)
        return after(step(chunks, _split(kv[0], chunks), _split(kv[1], chunks), carry))

    def body(s, c):
        kv, carry = c
        nxt = jax.lax.ppermute(kv, cp.axis, _ring_perm(cp.size))
        return nxt, one(s, kv, carry)

    kv, carry = jax.lax.fori_loop(0, cp.size - 1, body, ((k, v), carry))
    return one(cp.size - 1, kv, carry)


# The ring's fast path: plain masks (no mask, top-left causal; no bias), one engine call
# per step whatever the chunks, as Megatron and TransformerEngine schedule it. With the
# dual chunks (rank r: chunks r, 2cp-1-r), step 0 is one causal call of the local q and k
# (the local order keeps the global one); a block from a lower rank is seen whole by both
# q chunks through its first chunk; one from a higher rank is seen whole by q's second
# chunk. Unbalanced: step 0 causal, a lower rank's block whole, a higher rank's skipped.
# One switch per step (the GPU reads one predicate per step).


def _fast_case(q_chunks, kv_chunks):
    """0: the device's own block, 1: a lower rank's, 2: a higher rank's (traced)."""
    qp0, kp0 = q_chunks[0][0], kv_chunks[0][0]
    return jnp.where(kp0 == qp0, 0, jnp.where(kp0 < qp0, 1, 2))


def _fast_fwd_step(c: _Call, q, qs, q_chunks, call_fwd):
    balanced = len(q_chunks) == 2

    def call(qx, kx, vx, mode):
        return call_fwd(*c.block(qx, kx, vx, 0, 0, mode))

    def step(kv_chunks, ks, vs, carry):
        ((o, l),), ml = carry
        kf, vf = jnp.concatenate(ks, axis=1), jnp.concatenate(vs, axis=1)

        def all_rows(res):
            o2, l2 = _merge((o, l), res[:2])
            return ((o2, l2),), jnp.maximum(ml, res[2])

        if c.plain == "none":
            return all_rows(call(q, kf, vf, "none"))

        def upper():
            if not balanced:
                return vary_like((((o, l),), ml), q, kf, vf)
            C = qs[0].shape[1]
            res = call(qs[1], kf, vf, "none")
            o2, l2 = _merge((o[:, C:], l[..., C:]), res[:2])
            return (((jnp.concatenate([o[:, :C], o2], 1), jnp.concatenate([l[..., :C], l2], 2)),),
                    jnp.maximum(ml, res[2]))

        lower_k, lower_v = (ks[0], vs[0]) if balanced else (kf, vf)
        return jax.lax.switch(_fast_case(q_chunks, kv_chunks), [
            lambda: all_rows(call(q, kf, vf, "causal")),
            lambda: all_rows(call(q, lower_k, lower_v, "none")),
            upper])

    return step


def _fast_bwd_step(c: _Call, q, q_chunks, qs, outs, douts, lses, out, dout, lse, call_bwd):
    balanced = len(q_chunks) == 2
    f32 = jnp.float32

    def call(qx, kx, vx, ox, dx, lx, mode):
        bops, bcfg, bdims, bsm = c.block(qx, kx, vx, 0, 0, mode)
        return [g.astype(f32) for g in call_bwd(bops + [ox, dx, lx], bcfg, bdims, bsm)[:3]]

    def step(kv_chunks, ks, vs, carry):
        (dk, dv), (dq,), dbias, doffset, dsm = carry
        kf, vf = jnp.concatenate(ks, axis=1), jnp.concatenate(vs, axis=1)

        def done(dq2, dk2, dv2):
            return (dk2, dv2), (dq2,), dbias, doffset, dsm

        def whole(mode, kx=kf, vx=vf):
            g = call(q, kx, vx, out, dout, lse, mode)
            if kx is kf:
                return done(dq + g[0], dk + g[1], dv + g[2])
            C = kx.shape[1]
            return done(dq + g[0], dk.at[:, :C].add(g[1]), dv.at[:, :C].add(g[2]))

        if c.plain == "none":
            return whole("none")

        def upper():
            if not balanced:
                return vary_like(done(dq, dk, dv), q, kf, vf, dout)
            C = qs[0].shape[1]
            g = call(qs[1], kf, vf, outs[1], douts[1], lses[1], "none")
            return done(dq.at[:, C:].add(g[0]), dk + g[1], dv + g[2])

        lower = (lambda: whole("none", ks[0], vs[0])) if balanced else (lambda: whole("none"))
        return jax.lax.switch(_fast_case(q_chunks, kv_chunks),
                              [lambda: whole("causal"), lower, upper])

    return step


def forward(ops, cfg, dims, sm, training, cp: CPRun, base, call_fwd: Callable):
    """out [B, Sq_l, Hq, Dv], lse [B, Hq, Sq_l], max_logit [B, Hq] of one device."""
    ops = list(ops)
    q, k, v = ops[0], ops[1], ops[2]
    rank = cp.rank()
    ring = cp.strategy == CPStrategy.RING
    c = _block_call(cfg, dims, sm, ops, cp, base)
    q_chunks = cp.chunks(rank, dims.Sq)
    qs = _split(q, q_chunks)
    B, H, Dv = q.shape[0], q.shape[2], v.shape[-1]
    f32 = jnp.float32

    def step(kv_chunks, ks, vs, carry):
        acc, max_logit = list(carry[0]), carry[1]
        for i, (qc, (qp, cq)) in enumerate(zip(qs, q_chunks)):
            for kc, vc, (kp, ck) in zip(ks, vs, kv_chunks):
                def run(mode, qc=qc, kc=kc, vc=vc, qp=qp, kp=kp):
                    o, lse, ml = call_fwd(*c.block(qc, kc, vc, qp, kp, mode))
                    return o, (jnp.swapaxes(lse, 1, 2) if cp.thd else lse), ml

                def skip(cq=cq):
                    return (jnp.zeros((B, cq, H, Dv), q.dtype), jnp.full((B, H, cq), NEG_INF, f32),
                            jnp.full((B, H), NEG_INF, f32))

                o, lse, ml = c.dispatch(qp, cq, kp, ck, run, skip, qc, kc, vc)
                acc[i] = _merge(acc[i], (o, lse))
                max_logit = jnp.maximum(max_logit, ml)
        return tuple(acc), max_logit

    if ring and c.plain is not None and not ops[3].size:
        step = _fast_fwd_step(c, q, qs, q_chunks, call_fwd)
        q_chunks_acc = [(None, q.shape[1])]
    else:
        q_chunks_acc = q_chunks
    acc0 = tuple((jnp.zeros((B, cq, H, Dv), f32), jnp.full((B, H, cq), NEG_INF, f32))
                 for _, cq in q_chunks_acc)
    acc, max_logit = _steps(k, v, cp, rank, dims.Skv, not ring,
                            (acc0, jnp.full((B, H), NEG_INF, f32)), step, refs=(q, k, v))
    sink = None if c.sink_in_call else _sink(cfg, ops[4], dims.Hq)
    outs, lses = [], []
    # (the fast path keeps one acc of every row; it serves no padding mask)
    chunks = q_chunks if len(acc) == len(q_chunks) else [(q_chunks[0][0], q.shape[1])]
    for (o, lse), (qp, cq) in zip(acc, chunks):
        o, lse = _add_sink(o, lse, sink, None if sink is None else c.real_rows(qp, cq))
        outs.append(o.astype(q.dtype))
        lses.append(lse)
    out = jnp.concatenate(outs, axis=1)
    lse = jnp.concatenate(lses, axis=2)
    if cp.thd:  # THD's lse is [B, T, H]
        lse = jnp.swapaxes(lse, 1, 2)
    return out, lse, jax.lax.pmax(max_logit, cp.axis)


def backward(ops, out, dout, lse, cfg, dims, sm, cp: CPRun, base, call_bwd: Callable):
    """dq, dk, dv (the shards), dbias (whole), d softmax_offset [Hq] and, with a score_mod,
    d of its operands (whole), each summed over the cp axis where it is replicated. Each
    block's backward is given the call's final out and lse: its dq / dk / dv are then that
    block's exact share of the unsharded gradients. In the ring dk / dv travel with their
    block and go home after the last step."""
    ops = list(ops)
    q, k, v, bias, offset = ops[:5]
    rank = cp.rank()
    ring = cp.strategy == CPStrategy.RING
    c = _block_call(cfg, dims, sm, ops, cp, base)
    q_chunks = cp.chunks(rank, dims.Sq)
    qs, outs, douts = _split(q, q_chunks), _split(out, q_chunks), _split(dout, q_chunks)
    lses = _split(lse, q_chunks, axis=1 if cp.thd else 2)  # THD's lse is [B, T, H]
    f32 = jnp.float32
    take_offset = c.sink_in_call and offset.size

    def step(kv_chunks, ks, vs, carry):
        (dk_all, dv_all), dqs, dbias, doffset, dsm = carry
        dqs = list(dqs)
        dks, dvs = _split(dk_all, kv_chunks), _split(dv_all, kv_chunks)
        for i, (qp, cq) in enumerate(q_chunks):
            for j, (kp, ck) in enumerate(kv_chunks):
                def run(mode, i=i, j=j, qp=qp, kp=kp):
                    bops, bcfg, bdims, bsm = c.block(qs[i], ks[j], vs[j], qp, kp, mode)
                    g = call_bwd(bops + [outs[i], douts[i], lses[i]], bcfg, bdims, bsm)
                    return tuple(x.astype(f32) for x in g[:3]) + tuple(g[3:])

                def skip(i=i, j=j, cq=cq, ck=ck):
                    zb = jnp.zeros(bias.shape[:2] + (cq, ck), bias.dtype) if bias.size else bias
                    zo = jnp.zeros((dims.Hq,) if take_offset else (0,), f32)
                    zs = (jnp.zeros(c.sm_size(cq, ck), f32),) if sm is not None else ()
                    return (jnp.zeros(qs[i].shape, f32), jnp.zeros(ks[j].shape, f32),
                            jnp.zeros(vs[j].shape, f32), zb, zo) + zs

                g = c.dispatch(qp, cq, kp, ck, run, skip, qs[i], ks[j], vs[j], douts[i])
                dqs[i] = dqs[i] + g[0]
                dks[j], dvs[j] = dks[j] + g[1], dvs[j] + g[2]
                if bias.size:
                    dbias = c.bias_place(g[3], qp, kp, dbias)
                if take_offset:
                    doffset = doffset + g[4]
                if sm is not None:
                    dsm = c.sm_place(g[5], qp, cq, kp, ck, dsm)
        dkv = (jnp.concatenate(dks, axis=1), jnp.concatenate(dvs, axis=1))
        return dkv, tuple(dqs), dbias, doffset, dsm

    def send(carry):  # the ring: dk / dv go on with their block (the last step: home)
        return (jax.lax.ppermute(carry[0], cp.axis, _ring_perm(cp.size)),) + carry[1:]

    fast = ring and c.plain is not None and not bias.size
    if fast:
        step = _fast_bwd_step(c, q, q_chunks, qs, outs, douts, lses, out, dout, lse, call_bwd)
        qs = [q]
    after, gathered = (send if ring else None), []
    if cp.thd and not ring:  # each gathered block's dk / dv kept, the next starts from 0
        def after(carry):
            gathered.append(carry[0])
            return (jax.tree.map(jnp.zeros_like, carry[0]),) + carry[1:]
    Skv_l = dims.Skv if not (ring or cp.thd) else k.shape[1]
    carry = ((jnp.zeros((k.shape[0], Skv_l) + k.shape[2:], f32),
              jnp.zeros((v.shape[0], Skv_l) + v.shape[2:], f32)),
             tuple(jnp.zeros(x.shape, f32) for x in qs),
             jnp.zeros(bias.shape, f32) if bias.size else bias,
             jnp.zeros((dims.Hq,) if offset.size else (0,), f32),
             jnp.zeros(ops[11].shape, f32) if sm is not None else None)
    (dk, dv), dqs, dbias, doffset, dsm = _steps(k, v, cp, rank, dims.Skv, not ring, carry, step,
                                                after=after, refs=(q, k, v, dout))
    if not c.sink_in_call:
        sink = _sink(cfg, offset, dims.Hq)
        if offset.size and sink is not None:
            # d offset[h] = -sum over rows of exp(offset[h] - lse) * (dout . out)
            for i in range(len(q_chunks)):
                Dr = jnp.einsum("bshd,bshd->bhs", douts[i].astype(f32), outs[i].astype(f32))
                li = jnp.swapaxes(lses[i], 1, 2) if cp.thd else lses[i]
                p = jnp.where(jnp.isneginf(li), 0.0, jnp.exp(sink[None, :, None] - li))
                doffset = doffset - jnp.sum(p * Dr, axis=(0, 2))
    if gathered:  # THD all-gather: the blocks in rank order, summed over the axis
        dk = jax.lax.psum_scatter(jnp.concatenate([g[0] for g in gathered], axis=1), cp.axis,
                                  scatter_dimension=1, tiled=True)
        dv = jax.lax.psum_scatter(jnp.concatenate([g[1] for g in gathered], axis=1), cp.axis,
                                  scatter_dimension=1, tiled=True)
    elif not ring:
        dk, dv = _scatter_natural(dk, cp), _scatter_natural(dv, cp)
    dq = jnp.concatenate(dqs, axis=1).astype(q.dtype)
    grads = [dq, dk.astype(k.dtype), dv.astype(v.dtype)]
    grads.append(jax.lax.psum(dbias, cp.axis).astype(bias.dtype) if bias.size else
                 jnp.zeros(bias.shape, bias.dtype))
    grads.append(jax.lax.psum(doffset, cp.axis) if offset.size else doffset)
    if sm is not None:
        grads.append(jax.lax.psum(dsm, cp.axis))
    return tuple(grads)


# ---------------------------------------------------------------------------
# attention.py's glue: the static arguments, the plan's cp axis, the operands' layout


def config(strategy, axis, load_balanced, stripe_size, cfg: Config):
    """The static context-parallel arguments (checked) or None."""
    where = "fused_attn"
    balanced = static_bool(load_balanced, "context_parallel_causal_load_balanced", where)
    try:
        strategy = (CPStrategy[strategy.upper()] if isinstance(strategy, str)
                    else CPStrategy(strategy))
    except (KeyError, ValueError, TypeError):
        raise ValueError(f"{where}: context_parallel_strategy must be a CPStrategy (DEFAULT, "
                         f"ALL_GATHER, RING) or its name; got {strategy!r}") from None
    if stripe_size is not None:
        stripe_size = static_int(stripe_size, "stripe_size", where, "a positive Python int")
        if stripe_size < 1 or not cfg.thd:
            raise ValueError(f"{where}: stripe_size={stripe_size}: striped load balancing "
                             "takes THD layouts and a stripe_size >= 1 (BSHD layouts balance "
                             "by dual chunks: leave it None)")
    if axis is None:
        return None
    if not isinstance(axis, str) or not axis:
        raise ArgumentTypeError(f"{where}: context_parallel_axis must be a mesh axis name (a "
                                f"str) or None; got {axis!r}")
    if cfg.thd and balanced and stripe_size is None:
        raise ValueError(f"{where}: load-balanced context parallelism of a THD layout is "
                         "striped: give stripe_size (the inputs in reorder_causal_load_"
                         "balancing(..., ReorderStrategy.Striped, cp, stripe_size=...) order)")
    if cfg.thd and cfg.bias_type != AttnBiasType.NO_BIAS:
        raise NotImplementedError(f"{where}: a bias with a THD layout is not served under "
                                  "context parallelism")
    if strategy == CPStrategy.DEFAULT:
        strategy = CPStrategy.ALL_GATHER
    return CPConfig(axis, strategy, balanced,
                                     stripe_size if cfg.thd and balanced else None)


def forced_axes(static, mesh) -> dict:
    """Context parallelism shards q's and k / v's sequence over its axis."""
    cp = static[0].cp
    if cp is None or cp.axis not in mesh.shape or mesh.shape[cp.axis] <= 1:
        return {}
    types = dict(zip(mesh.axis_names, getattr(mesh, "axis_types", ()) or ()))
    if types.get(cp.axis) == jax.sharding.AxisType.Manual:
        return {}  # inside shard_map: the body runs the algorithm on its shards
    return {"c": (cp.axis,), "ckv": (cp.axis,)}


def run_of(cfg: Config, plan) -> CPRun | None:
    """The context parallelism of this device's call: on a mesh, the plan's cp axis;
    inside shard_map, the manual cp axis; None without one (a plain call)."""
    if cfg.cp is None:
        return None
    if plan is not None and plan.of("c"):
        size = plan.size("c")
    else:  # inside shard_map, the axis manual (bound) or not there
        try:
            size = jax.lax.axis_size(cfg.cp.axis)
        except (NameError, KeyError, ValueError):
            return None
    if size <= 1:
        return None
    return CPRun(cfg.cp.axis, size, cfg.cp.strategy, cfg.cp.load_balanced,
                                  cfg.cp.stripe, cfg.thd)


def global_dims(cfg: Config, dims: Dims, sm, plan, cp, ops) -> Dims:
    """The global sequence lengths of a cp call: on a mesh the partitioner's dims; inside
    shard_map the call was traced on the shards, so cp times theirs."""
    if plan is not None and plan.of("c"):
        return dims
    if ops[3].size or (sm is not None and any(s[2] > 1 or s[3] > 1
                                              for s in sm.operand_shapes)):
        raise NotImplementedError(
            "fused_attn: inside shard_map, context parallelism takes no bias and no score_mod "
            "operand with a sequence dim (they would be per-shard there); call fused_attn "
            "under jit on the mesh instead, where they stay whole")
    return dataclasses.replace(dims, Sq=dims.Sq * cp.size, Skv=dims.Skv * cp.size)


def shard_base(ops):
    """(batch_base, head_base) of one slice's operands (0, 0 when none is given)."""
    ib = ops[10]
    if ib.size:
        return ib[0], ib[1]
    return jnp.int32(0), jnp.int32(0)


def split_qkv(cfg: Config, ops):
    """q, k, v of any BSHD layout as three arrays (context parallelism's blocks)."""
    q, k, v = unpack(*ops[:3], cfg.layout)
    return [q, k, v] + list(ops[3:])


def join_grads(cfg: Config, grads):
    """dq, dk, dv back into the call's layout."""
    dq, dk, dv = grads[:3]
    if cfg.layout in QKV_PACKED:
        return (jnp.stack([dq, dk, dv], axis=2), jnp.zeros((0,), dq.dtype),
                jnp.zeros((0,), dq.dtype)) + tuple(grads[3:])
    if cfg.layout in KV_PACKED:
        return (dq, jnp.stack([dk, dv], axis=2), jnp.zeros((0,), dq.dtype)) + tuple(grads[3:])
    return tuple(grads)
