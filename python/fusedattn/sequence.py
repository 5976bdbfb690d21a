"""SequenceDescriptor: where the sequences of each batch row are, and how long.

Every row b of a batch holds M = max_segments_per_seq segments (M = 1 for the BSHD
layouts): segment s has q_seqlens[b, s] query tokens starting at token q_offsets[b, s]
of the row, and kv_seqlens[b, s] key/value tokens starting at kv_offsets[b, s]. The
query tokens of segment s attend only to the key tokens of segment s; tokens outside
every segment are padding (output 0). BSHD layouts read only the lengths: their one
segment starts at token 0. Lengths, offsets and segment ids are integer arrays: the
constructors, and fused_attn for a descriptor built directly, reject float (or bool) ones
rather than truncate them.

Invalid descriptors have one meaning on every backend (csrc/fusedattn/attention/mask.h,
reference.py): offsets and lengths are clamped to the tensors' extents, a THD segment
ends at the next segment's offset at the latest (offsets[:, M] bounds the last one), and
a segment whose offset is below an earlier segment's offset is empty; so segments never
overlap. fused_attn(..., check_descriptors=True) turns such descriptors into an error
instead (check_descriptor below; under jit through jax.experimental.checkify).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ._args import ArgumentTypeError, got, static_int


def _as_array(x, name, ctor, form):
    """x as an array (lists of ints are taken); None, strings and the like raise."""
    if x is None or isinstance(x, (str, bytes)):
        raise ArgumentTypeError(f"SequenceDescriptor.{ctor}: {name} must be an integer array "
                                f"{form}; got {got(x)}")
    try:
        return jnp.asarray(x)
    except (TypeError, ValueError, OverflowError):
        raise ArgumentTypeError(f"SequenceDescriptor.{ctor}: {name} must be an integer array "
                                f"{form}; got {got(x)}") from None


def _check_int_dtype(x, name, ctor, form):
    # Lengths, offsets and ids are never truncated from floats (nor read from bools).
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise ArgumentTypeError(f"SequenceDescriptor.{ctor}: {name} must be an integer array "
                                f"{form}; got shape {x.shape} dtype {x.dtype}")


def _int_array(x, name, ctor, form="[B] or [B, M]", ranks=(1, 2)):
    x = _as_array(x, name, ctor, form)
    _check_int_dtype(x, name, ctor, form)
    if x.ndim not in ranks:
        pair = " (a list or tuple of two is the pair (for q, for kv))" if x.ndim == 0 else ""
        raise ValueError(f"SequenceDescriptor.{ctor}: {name} must be an integer array {form}; "
                         f"got shape {x.shape} dtype {x.dtype}{pair}")
    return (x if x.ndim == 2 else x[:, None]).astype(jnp.int32)


def _pair(x, name, ctor):
    """x or (x_q, x_kv) -> (x_q, x_kv)."""
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ValueError(f"SequenceDescriptor.{ctor}: {name} must be an array or a pair "
                             f"(for q, for kv); got a sequence of {len(x)} items")
        return x[0], x[1]
    return x, x


def packed_offsets(seqlens: jax.Array) -> jax.Array:
    """int32 [B, M + 1]: the segments of each row laid back to back from token 0."""
    zero = jnp.zeros(seqlens.shape[:-1] + (1,), jnp.int32)
    return jnp.concatenate([zero, jnp.cumsum(jnp.maximum(seqlens, 0), axis=-1)], axis=-1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SequenceDescriptor:
    """Segment lengths int32 [B, M] (or [B]: one segment per row) and token offsets
    int32 [B, M + 1] (None: segments packed back to back from token 0).

    max_segment_seqlen_q, max_segment_seqlen_kv (static, optional): the caller's promise
    that no segment has more query / key tokens. With max_segment_seqlen_kv <= 64 (and
    one query per segment) fused_attn runs the small-seq backend (fused_attn_small_seq);
    a segment that breaks the promise is still computed exactly, only slower.
    """

    q_seqlens: jax.Array
    kv_seqlens: jax.Array
    q_offsets: jax.Array | None = None
    kv_offsets: jax.Array | None = None
    # int32 [B]: the runs from_segment_ids_and_pos found per row, before dropping those
    # past max_segments_per_seq (None: not built from segment ids); read by the checks.
    q_runs: jax.Array | None = None
    kv_runs: jax.Array | None = None
    max_segment_seqlen_q: int | None = dataclasses.field(default=None,
                                                         metadata=dict(static=True))
    max_segment_seqlen_kv: int | None = dataclasses.field(default=None,
                                                          metadata=dict(static=True))

    def with_max_segment_seqlens(self, max_segment_seqlen_q: int | None = None,
                                 max_segment_seqlen_kv: int | None = None
                                 ) -> "SequenceDescriptor":
        """This descriptor with the promised per-segment maxima (see the class docstring)."""
        maxima = {}
        for name, x in (("max_segment_seqlen_q", max_segment_seqlen_q),
                        ("max_segment_seqlen_kv", max_segment_seqlen_kv)):
            allowed = "a Python int >= 1 or None"
            maxima[name] = None if x is None else static_int(x, name, "SequenceDescriptor",
                                                             allowed)
            if x is not None and maxima[name] < 1:
                raise ValueError(f"SequenceDescriptor: {name} must be {allowed}; got {x!r}")
        return dataclasses.replace(self, **maxima)

    @property
    def max_segments_per_seq(self) -> int:
        return 1 if self.q_seqlens.ndim == 1 else int(self.q_seqlens.shape[-1])

    @classmethod
    def from_seqlens(cls, seqlens, *, max_segment_seqlen_q=None,
                     max_segment_seqlen_kv=None) -> "SequenceDescriptor":
        """seqlens: int [B] or [B, M] for both q and kv, or a pair (q_seqlens, kv_seqlens).

        Segments are packed back to back from token 0 of each row (offsets = cumulative
        lengths)."""
        q, kv = _pair(seqlens, "seqlens", "from_seqlens")
        q = _int_array(q, "q_seqlens", "from_seqlens")
        kv = _int_array(kv, "kv_seqlens", "from_seqlens")
        if q.shape != kv.shape:
            raise ValueError(f"SequenceDescriptor.from_seqlens: q_seqlens {q.shape} and "
                             f"kv_seqlens {kv.shape} must have the same batch size and segments")
        return cls(q, kv, packed_offsets(q), packed_offsets(kv)).with_max_segment_seqlens(
            max_segment_seqlen_q, max_segment_seqlen_kv)

    @classmethod
    def from_seqlens_and_offsets(cls, seqlens, offsets, *, max_segment_seqlen_q=None,
                                 max_segment_seqlen_kv=None) -> "SequenceDescriptor":
        """seqlens int [B, M] and offsets int [B, M + 1] (token where each segment starts;
        the last column is where the row's last segment ends), each for both q and kv or
        a pair (for q, for kv)."""
        ctor = "from_seqlens_and_offsets"
        q, kv = _pair(seqlens, "seqlens", ctor)
        qo, kvo = _pair(offsets, "offsets", ctor)
        q, kv = _int_array(q, "q_seqlens", ctor), _int_array(kv, "kv_seqlens", ctor)
        qo = _int_array(qo, "q_offsets", ctor, "[B, M + 1]", (2,))
        kvo = _int_array(kvo, "kv_offsets", ctor, "[B, M + 1]", (2,))
        if q.shape != kv.shape:
            raise ValueError(f"SequenceDescriptor.{ctor}: q_seqlens {q.shape} and kv_seqlens "
                             f"{kv.shape} must have the same shape [B, M]")
        for name, lens, offs in (("q", q, qo), ("kv", kv, kvo)):
            want = lens.shape[:-1] + (lens.shape[-1] + 1,)
            if offs.shape != want:
                raise ValueError(f"SequenceDescriptor.{ctor}: {name}_offsets must have shape "
                                 f"[B, M + 1] = {list(want)}; got {list(offs.shape)}")
        return cls(q, kv, qo, kvo).with_max_segment_seqlens(max_segment_seqlen_q,
                                                            max_segment_seqlen_kv)

    @classmethod
    def from_segment_ids_and_pos(cls, segment_ids, segment_pos=None, *,
                                 max_segments_per_seq=None) -> "SequenceDescriptor":
        """segment_ids int [B, S] (0 = padding), for both q and kv or a pair (q_ids, kv_ids);
        segment_pos int [B, S] (optional, likewise): each token's position in its segment.

        A segment is a run of equal non-zero ids; where segment_pos is given, a token whose
        position does not continue the previous token's starts a new segment too. The q
        and kv segments of a row are matched by their order in the row. Runs past
        max_segments_per_seq (default: S) are dropped (their tokens become padding)."""
        ctor = "from_segment_ids_and_pos"
        q_ids, kv_ids = _pair(segment_ids, "segment_ids", ctor)
        q_pos, kv_pos = _pair(segment_pos, "segment_pos", ctor)
        q_ids = _as_array(q_ids, "q segment_ids", ctor, "[B, S]")
        kv_ids = _as_array(kv_ids, "kv segment_ids", ctor, "[B, S]")
        for name, ids in (("q segment_ids", q_ids), ("kv segment_ids", kv_ids)):
            _check_int_dtype(ids, name, ctor, "[B, S]")
            if ids.ndim != 2:
                raise ValueError(f"SequenceDescriptor.{ctor}: {name} must be an integer array "
                                 f"[B, S]; got shape {ids.shape} dtype {ids.dtype}")
        if q_ids.shape[0] != kv_ids.shape[0]:
            raise ValueError(f"SequenceDescriptor.{ctor}: q and kv segment_ids have different "
                             f"batch sizes: {q_ids.shape[0]} and {kv_ids.shape[0]}")
        if max_segments_per_seq is None:
            M = max(q_ids.shape[1], kv_ids.shape[1])
        else:
            M = static_int(max_segments_per_seq, "max_segments_per_seq", f"SequenceDescriptor."
                           f"{ctor}", "a Python int >= 1 or None")
            if M < 1:
                raise ValueError(f"SequenceDescriptor.{ctor}: max_segments_per_seq must be >= 1; "
                                 f"got {M}")
        q_lens, q_offs, q_runs = _runs(q_ids, q_pos, M, ctor)
        kv_lens, kv_offs, kv_runs = _runs(kv_ids, kv_pos, M, ctor)
        return cls(q_lens, kv_lens, q_offs, kv_offs, q_runs, kv_runs)


def _runs(ids, pos, M, ctor):
    """Runs of equal non-zero ids in each row of ids [B, S] -> lengths [B, M], offsets
    [B, M + 1] (empty segments start where the row's last run ends), runs per row [B]."""
    B, S = ids.shape
    real = ids != 0
    prev = jnp.pad(ids, ((0, 0), (1, 0)))[:, :-1]
    start = real & (ids != prev)
    if pos is not None:
        pos = _as_array(pos, "segment_pos", ctor, "[B, S]")
        if pos.shape != ids.shape or not jnp.issubdtype(pos.dtype, jnp.integer):
            raise ValueError(f"SequenceDescriptor.{ctor}: segment_pos must be an integer array "
                             f"of the shape of segment_ids {ids.shape}; got shape {pos.shape} "
                             f"dtype {pos.dtype}")
        prev_pos = jnp.pad(pos, ((0, 0), (1, 0)), constant_values=-2)[:, :-1]
        start |= real & (pos != prev_pos + 1)
    seg = jnp.cumsum(start, axis=1) - 1  # run index of each token (-1 before the first run)
    rows = jnp.arange(B)[:, None]
    idx = jnp.where(real & (seg < M), seg, M)  # M: dropped (padding or too many runs)
    lens = jnp.zeros((B, M + 1), jnp.int32).at[rows, idx].add(1)[:, :M]
    token = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
    first = jnp.full((B, M + 1), S, jnp.int32).at[rows, jnp.where(start, idx, M)].min(token)
    ends = jnp.where(lens > 0, first[:, :M] + lens, 0)
    row_end = jnp.max(ends, axis=1, initial=0)[:, None]
    offsets = jnp.where(lens > 0, first[:, :M], row_end)
    runs = jnp.sum(start, axis=1).astype(jnp.int32)
    return lens, jnp.concatenate([offsets, row_end], axis=1).astype(jnp.int32), runs


def _first(bad):
    """(any, row, segment) of the first True of bad [B, N] (row-major)."""
    flat = jnp.argmax(bad.reshape(-1))
    return jnp.any(bad), flat // bad.shape[1], flat % bad.shape[1]


def check_descriptor(q_lens, kv_lens, q_offsets, kv_offsets, *, seqlen_q: int, seqlen_kv: int,
                     thd: bool, padding: bool, q_runs=None, kv_runs=None,
                     caller: str = "fused_attn"):
    """checkify checks that a call's descriptor is valid, so that no clamping changes it.

    q_lens / kv_lens int32 [B, M], q_offsets / kv_offsets int32 [B, M + 1]; q_runs /
    kv_runs int32 [B] or None (SequenceDescriptor.q_runs). Checked per side, in this
    order: (THD) offsets inside [0, S], offsets in order (non-decreasing), (padding masks)
    lengths >= 0, a segment past the end of the buffer (THD: offset + length > S; BSHD:
    length > S), (THD) a segment running into the next one (offset + length >
    offsets[s + 1], an overlap), and more segment runs than max_segments_per_seq.

    Eagerly a failed check raises at once; under jit, wrap the function with
    jax.experimental.checkify.checkify and call err.throw() (a bare jit refuses to stage
    an unfunctionalized check, by JAX's design)."""
    from jax.experimental import checkify

    for side, lens, offs, S, runs in (("q", q_lens, q_offsets, seqlen_q, q_runs),
                                      ("kv", kv_lens, kv_offsets, seqlen_kv, kv_runs)):
        where = f"{caller}(check_descriptors=True): sequence_descriptor {side}"
        lens = jnp.asarray(lens, jnp.int32)
        M = lens.shape[1]
        if thd:
            offs = jnp.asarray(offs, jnp.int32)
            bad, b, s = _first((offs < 0) | (offs > S))
            checkify.check(~bad, where + "_offsets[{b}, {s}] = {v} is outside the buffer "
                           f"[0, {S}]", b=b, s=s, v=offs[b, s])
            bad, b, s = _first(offs[:, 1:] < offs[:, :-1])
            checkify.check(~bad, where + "_offsets are out of order in row {b}: offsets[{s}] = "
                           "{v} > offsets[{s1}] = {w} (offsets must be non-decreasing)",
                           b=b, s=s, s1=s + 1, v=offs[b, s], w=offs[b, s + 1])
        if padding:
            bad, b, s = _first(lens < 0)
            checkify.check(~bad, where + "_seqlens[{b}, {s}] = {v} is negative", b=b, s=s,
                           v=lens[b, s])
            begin = jnp.clip(offs[:, :M], 0, S) if thd else jnp.zeros_like(lens)
            bad, b, s = _first(lens > S - begin)
            checkify.check(~bad, where + " segment {s} of row {b} (offset {o}, length {v}) runs "
                           f"past the end of the buffer ({S} tokens)", b=b, s=s, o=begin[b, s],
                           v=lens[b, s])
            if thd:
                nxt = jnp.clip(offs[:, 1:], 0, S)
                bad, b, s = _first(lens > nxt - begin)
                checkify.check(~bad, where + " segment {s} of row {b} (offset {o}, length {v}) "
                               "overlaps the next one, which starts at offset {n} (offsets[:, M] "
                               "bounds the last segment)", b=b, s=s, o=begin[b, s], v=lens[b, s],
                               n=nxt[b, s])
        if runs is not None:
            runs = jnp.asarray(runs, jnp.int32).reshape(-1, 1)
            bad, b, _ = _first(runs > M)
            checkify.check(~bad, where + " segment ids of row {b} hold {v} runs, more than "
                           f"max_segments_per_seq={M} (the runs past it would be dropped)",
                           b=b, v=runs[b, 0])
