"""SequenceDescriptor: where the sequences of each batch row are, and how long.

Every row b of a batch holds M = max_segments_per_seq segments (M = 1 for the BSHD
layouts): segment s has q_seqlens[b, s] query tokens starting at token q_offsets[b, s]
of the row, and kv_seqlens[b, s] key/value tokens starting at kv_offsets[b, s]. The
query tokens of segment s attend only to the key tokens of segment s; tokens outside
every segment are padding (output 0). BSHD layouts read only the lengths: their one
segment starts at token 0. Lengths and offsets are integer arrays: the constructors, and
fused_attn for a descriptor built directly, reject float (or bool) ones rather than
truncate them. Segment ids are labels, compared for equality only: integer, bool or
float arrays (TransformerEngine's tests pass float ones), 0 = padding.

M is the call's (fused_attn(..., max_segments_per_seq=M)); a descriptor is resolved to
it at call time, as TransformerEngine resolves its descriptors:
  - built from segment ids (from_segment_ids_and_pos): the ids and positions are kept,
    and the runs are found at call time; runs past M are dropped (their tokens become
    padding). A max_segments_per_seq given to the constructor resolves it at once too
    (q_seqlens etc. then hold that resolution), but the call's M decides.
  - lengths [B, W] and offsets [B, W + 1] of a width W other than M (TransformerEngine
    pads them with -1 to the sequence length, and q and kv may have different widths in
    cross attention) are compacted to M, each array on its own: its non-negative entries
    first, in order, then the fill (lengths 0, offsets the buffer's extent, so that the
    fill segments are empty), the entries past M dropped. Lengths built by from_seqlens
    (offsets packed from them) get their offsets packed again from the compacted lengths.
    Arrays of width M are used as they are, but for each row's trailing -1 entries: such a
    length is an empty segment (0, so check_descriptors takes it as it takes the compacted
    fill), such an offset the buffer's extent (TE's start-only offsets, -1 where the end
    column would be, then do not cut the last segment short).
  A descriptor whose rows hold more than M segments loses those past M; when the arrays
  are concrete at trace time fused_attn warns, and check_descriptors=True makes it an
  error.

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
import numpy as np

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


def _ids_array(x, name, ctor):
    """Segment ids [B, S]: labels (integer, bool or float; compared for equality only)."""
    x = _as_array(x, name, ctor, "[B, S]")
    if not (jnp.issubdtype(x.dtype, jnp.integer) or jnp.issubdtype(x.dtype, jnp.floating)
            or x.dtype == jnp.bool_):
        raise ArgumentTypeError(f"SequenceDescriptor.{ctor}: {name} must be an integer, bool or "
                                f"float array [B, S]; got shape {x.shape} dtype {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"SequenceDescriptor.{ctor}: {name} must be an array [B, S]; got "
                         f"shape {x.shape} dtype {x.dtype}")
    return x


def _segments_arg(max_segments_per_seq, ctor):
    if max_segments_per_seq is None:
        return None
    M = static_int(max_segments_per_seq, "max_segments_per_seq", f"SequenceDescriptor.{ctor}",
                   "a Python int >= 1 or None")
    if M < 1:
        raise ValueError(f"SequenceDescriptor.{ctor}: max_segments_per_seq must be >= 1; got {M}")
    return M


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SequenceDescriptor:
    """Segment lengths int32 [B, M] (or [B]: one segment per row) and token offsets
    int32 [B, M + 1] (None: segments packed back to back from token 0), or the segment
    ids and positions [B, S] they are found from at call time (the module docstring says
    how a descriptor is resolved to the call's max_segments_per_seq).

    max_segment_seqlen_q, max_segment_seqlen_kv (static, optional): the caller's promise
    that no segment has more query / key tokens. With max_segment_seqlen_kv <= 64 (and
    one query per segment) fused_attn runs the small-seq backend (fused_attn_small_seq);
    a segment that breaks the promise is still computed exactly, only slower.
    """

    q_seqlens: jax.Array | None = None
    kv_seqlens: jax.Array | None = None
    q_offsets: jax.Array | None = None
    kv_offsets: jax.Array | None = None
    # int32 [B]: the segments found per row before dropping those past max_segments_per_seq
    # (segment-id runs, or non-negative lengths when compacted; None: not counted); read by
    # the checks.
    q_runs: jax.Array | None = None
    kv_runs: jax.Array | None = None
    # [B, Sq] / [B, Skv]: kept by from_segment_ids_and_pos, resolved at call time.
    q_segment_ids: jax.Array | None = None
    kv_segment_ids: jax.Array | None = None
    q_segment_pos: jax.Array | None = None
    kv_segment_pos: jax.Array | None = None
    max_segment_seqlen_q: int | None = dataclasses.field(default=None,
                                                         metadata=dict(static=True))
    max_segment_seqlen_kv: int | None = dataclasses.field(default=None,
                                                          metadata=dict(static=True))
    # from_seqlens: the offsets were packed from the lengths (compaction packs them again).
    offsets_packed: bool = dataclasses.field(default=False, metadata=dict(static=True))
    # What q_runs / kv_runs count: "segment ids" (runs) or "seqlens" (non-negative entries).
    runs_of: str = dataclasses.field(default="segment ids", metadata=dict(static=True))

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
    def has_segment_ids(self) -> bool:
        return self.q_segment_ids is not None

    @property
    def max_segments_per_seq(self) -> int | None:
        """The segments per row of the lengths (None: segment ids not resolved yet)."""
        if self.q_seqlens is None:
            return None
        return 1 if self.q_seqlens.ndim == 1 else int(self.q_seqlens.shape[-1])

    @classmethod
    def from_seqlens(cls, seqlens, *, max_segment_seqlen_q=None,
                     max_segment_seqlen_kv=None) -> "SequenceDescriptor":
        """seqlens: int [B] or [B, W] for both q and kv, or a pair (q_seqlens, kv_seqlens)
        (of different widths W if need be; -1 entries are padding, compacted at call time).

        Segments are packed back to back from token 0 of each row (offsets = cumulative
        lengths)."""
        q, kv = _pair(seqlens, "seqlens", "from_seqlens")
        q = _int_array(q, "q_seqlens", "from_seqlens")
        kv = _int_array(kv, "kv_seqlens", "from_seqlens")
        if q.shape[0] != kv.shape[0]:
            raise ValueError(f"SequenceDescriptor.from_seqlens: q_seqlens {q.shape} and "
                             f"kv_seqlens {kv.shape} must have the same batch size")
        return cls(q, kv, packed_offsets(q), packed_offsets(kv),
                   offsets_packed=True).with_max_segment_seqlens(max_segment_seqlen_q,
                                                                 max_segment_seqlen_kv)

    @classmethod
    def from_seqlens_and_offsets(cls, seqlens, seq_offsets=None, *, offsets=None,
                                 max_segment_seqlen_q=None,
                                 max_segment_seqlen_kv=None) -> "SequenceDescriptor":
        """seqlens int [B, M] and seq_offsets int [B, M + 1] (token where each segment
        starts; the last column is where the row's last segment ends), each for both q and
        kv or a pair (for q, for kv). TransformerEngine's arrays (M the sequence length,
        padded with -1; q and kv of different widths in cross attention) are compacted to
        the call's max_segments_per_seq. offsets= is the older name of seq_offsets."""
        ctor = "from_seqlens_and_offsets"
        if (seq_offsets is None) == (offsets is None):
            raise ValueError(f"SequenceDescriptor.{ctor}: give seq_offsets (or its older name "
                             "offsets=), exactly one of them")
        q, kv = _pair(seqlens, "seqlens", ctor)
        qo, kvo = _pair(offsets if seq_offsets is None else seq_offsets, "seq_offsets", ctor)
        q, kv = _int_array(q, "q_seqlens", ctor), _int_array(kv, "kv_seqlens", ctor)
        qo = _int_array(qo, "q_offsets", ctor, "[B, M + 1]", (2,))
        kvo = _int_array(kvo, "kv_offsets", ctor, "[B, M + 1]", (2,))
        if q.shape[0] != kv.shape[0]:
            raise ValueError(f"SequenceDescriptor.{ctor}: q_seqlens {q.shape} and kv_seqlens "
                             f"{kv.shape} must have the same batch size")
        for name, lens, offs in (("q", q, qo), ("kv", kv, kvo)):
            want = lens.shape[:-1] + (lens.shape[-1] + 1,)
            if offs.shape != want:
                raise ValueError(f"SequenceDescriptor.{ctor}: {name}_offsets must have shape "
                                 f"[B, M + 1] = {list(want)} ({name}_seqlens is [B, M]); got "
                                 f"{list(offs.shape)}")
        return cls(q, kv, qo, kvo).with_max_segment_seqlens(max_segment_seqlen_q,
                                                            max_segment_seqlen_kv)

    @classmethod
    def from_segment_ids_and_pos(cls, segment_ids, segment_pos=None, *,
                                 max_segments_per_seq=None, is_thd=None,
                                 is_segment_ids_reordered=False) -> "SequenceDescriptor":
        """segment_ids [B, S] (0 = padding), for both q and kv or a pair (q_ids, kv_ids);
        segment_pos int [B, S] (optional, likewise): each token's position in its segment.

        A segment is a run of equal non-zero ids; where segment_pos is given, a token whose
        position does not continue the previous token's starts a new segment too. The q
        and kv segments of a row are matched by their order in the row. BSHD layouts take
        the first run of each row (its tokens counted from token 0).

        The ids are kept and resolved at call time with the call's max_segments_per_seq
        (runs past it are dropped: their tokens become padding). max_segments_per_seq given
        here resolves the descriptor at once too (q_seqlens etc. hold it), for readers of
        the lengths; the call's value still decides.
        is_thd (TransformerEngine 2.12's argument): accepted; the call's qkv_layout decides.
        is_segment_ids_reordered: ids in the load-balanced order of context parallelism are
        not taken (fusedattn's descriptors are global, in the sequence's natural order)."""
        ctor = "from_segment_ids_and_pos"
        if is_thd is not None and not isinstance(is_thd, bool):
            raise ArgumentTypeError(f"SequenceDescriptor.{ctor}: is_thd must be a bool or None; "
                                    f"got {got(is_thd)}")
        if not isinstance(is_segment_ids_reordered, bool):
            raise ArgumentTypeError(f"SequenceDescriptor.{ctor}: is_segment_ids_reordered must "
                                    f"be a bool; got {got(is_segment_ids_reordered)}")
        if is_segment_ids_reordered:
            raise ValueError(f"SequenceDescriptor.{ctor}: is_segment_ids_reordered=True is not "
                             "taken: pass the segment ids and positions in the natural order "
                             "(fusedattn's descriptors stay global under context parallelism; "
                             "only q, k and v are reordered)")
        q_ids, kv_ids = _pair(segment_ids, "segment_ids", ctor)
        q_pos, kv_pos = _pair(segment_pos, "segment_pos", ctor)
        q_ids = _ids_array(q_ids, "q segment_ids", ctor)
        kv_ids = _ids_array(kv_ids, "kv segment_ids", ctor)
        if q_ids.shape[0] != kv_ids.shape[0]:
            raise ValueError(f"SequenceDescriptor.{ctor}: q and kv segment_ids have different "
                             f"batch sizes: {q_ids.shape[0]} and {kv_ids.shape[0]}")
        q_pos, kv_pos = (None if pos is None else _pos_array(pos, ids.shape, ctor)
                         for pos, ids in ((q_pos, q_ids), (kv_pos, kv_ids)))
        sd = cls(q_segment_ids=q_ids, kv_segment_ids=kv_ids, q_segment_pos=q_pos,
                 kv_segment_pos=kv_pos)
        M = _segments_arg(max_segments_per_seq, ctor)
        return sd if M is None else sd.resolve_segment_ids(M)

    def resolve_segment_ids(self, max_segments_per_seq: int) -> "SequenceDescriptor":
        """This descriptor with lengths [B, M], offsets [B, M + 1] and runs [B] found from
        its segment ids (M = max_segments_per_seq)."""
        M = _segments_arg(max_segments_per_seq, "resolve_segment_ids")
        if not self.has_segment_ids:
            raise ValueError("SequenceDescriptor.resolve_segment_ids: this descriptor holds no "
                             "segment ids (build it by from_segment_ids_and_pos)")
        q_lens, q_offs, q_runs = _runs(self.q_segment_ids, self.q_segment_pos, M)
        kv_lens, kv_offs, kv_runs = _runs(self.kv_segment_ids, self.kv_segment_pos, M)
        return dataclasses.replace(self, q_seqlens=q_lens, kv_seqlens=kv_lens, q_offsets=q_offs,
                                   kv_offsets=kv_offs, q_runs=q_runs, kv_runs=kv_runs,
                                   offsets_packed=False, runs_of="segment ids")


def make_swa_mask(segment_pos_q, segment_pos_kv, window_size=None, dtype=jnp.float32):
    """TransformerEngine's sliding-window mask over token positions: [..., 1, Sq, Skv] of
    dtype, 1 where query i may see key j, pos_kv[j] in [pos_q[i] - left, pos_q[i] + right]
    (window_size = (left, right); a negative bound is unbounded; None: all ones).
    segment_pos_q [..., Sq], segment_pos_kv [..., Skv]: positions, e.g. in each segment."""
    pos_q = jnp.asarray(segment_pos_q)[..., :, None]
    pos_kv = jnp.asarray(segment_pos_kv)[..., None, :]
    keep = jnp.ones(jnp.broadcast_shapes(pos_q.shape, pos_kv.shape), jnp.bool_)
    if window_size is not None:
        if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
                or not all(isinstance(w, (int, np.integer)) and not isinstance(w, bool)
                           for w in window_size)):
            raise ArgumentTypeError(f"make_swa_mask: window_size must be None or a pair (left, "
                                    f"right) of Python ints (negative: unbounded); got "
                                    f"{got(window_size)}")
        left, right = window_size
        if left >= 0:
            keep &= pos_kv >= pos_q - left
        if right >= 0:
            keep &= pos_kv <= pos_q + right
    return jnp.expand_dims(keep, -3).astype(dtype)


def from_dense_mask(mask, mask_type, batch: int, seqlen_q: int, seqlen_kv: int):
    """TransformerEngine's deprecated sequence_descriptor form: a dense mask [B, 1 or H,
    Sq, Skv] (True or nonzero = masked out) of a BSHD call, read as TE reads it: it gives
    each row's lengths only (padding at the end of each sequence). The padding masks' q
    length is the number of queries that keep key 0, the kv length the keys that query 0
    keeps (PADDING_MASK) or the most keys any query keeps (the causal padding masks);
    the other mask types ignore it (None: full lengths)."""
    mask = _as_array(mask, "sequence_descriptor (a dense mask)", "fused_attn", "[B, 1, Sq, Skv]")
    want = f"[{batch}, 1 or H, {seqlen_q}, {seqlen_kv}]"
    if (mask.ndim != 4 or mask.shape[0] != batch or mask.shape[2:] != (seqlen_q, seqlen_kv)):
        raise ValueError(f"fused_attn: a dense mask as sequence_descriptor (TransformerEngine's "
                         f"deprecated form) must have shape {want} (True = masked out); got "
                         f"shape {tuple(mask.shape)}")
    if not mask_type.is_padding():
        return None
    keep = jnp.logical_not(mask.astype(jnp.bool_))
    q_lens = jnp.sum(keep, axis=-2, dtype=jnp.int32)[:, 0, 0]
    rows = jnp.sum(keep, axis=-1, dtype=jnp.int32)
    kv_lens = (rows[:, 0, 0] if mask_type == mask_type.PADDING_MASK
               else jnp.max(rows, axis=(-1, -2)))
    return SequenceDescriptor.from_seqlens((q_lens, kv_lens))


def _pos_array(pos, shape, ctor):
    pos = _as_array(pos, "segment_pos", ctor, "[B, S]")
    if pos.shape != shape or not jnp.issubdtype(pos.dtype, jnp.integer):
        raise ValueError(f"SequenceDescriptor.{ctor}: segment_pos must be an integer array "
                         f"of the shape of segment_ids {shape}; got shape {pos.shape} "
                         f"dtype {pos.dtype}")
    return pos


def _runs(ids, pos, M):
    """Runs of equal non-zero ids in each row of ids [B, S] -> lengths [B, M], offsets
    [B, M + 1] (empty segments start where the row's last run ends), runs per row [B]."""
    B, S = ids.shape
    real = ids != 0
    prev = jnp.pad(ids, ((0, 0), (1, 0)))[:, :-1]
    start = real & (ids != prev)
    if pos is not None:
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


def compact(x, width: int, fill):
    """x int32 [B, W] -> (its non-negative entries first, in order, then fill, cut or
    padded to int32 [B, width]; the non-negative entries per row, int32 [B])."""
    x = jnp.asarray(x, jnp.int32)
    B, W = x.shape
    if W < width:
        x = jnp.concatenate([x, jnp.full((B, width - W), -1, jnp.int32)], axis=1)
    valid = x >= 0
    order = jnp.argsort(jnp.logical_not(valid).astype(jnp.int32), axis=1, stable=True)
    kept = jnp.take_along_axis(x, order, axis=1)[:, :width]
    count = jnp.sum(valid, axis=1).astype(jnp.int32)
    col = jnp.arange(width, dtype=jnp.int32)[None, :]
    fill = jnp.broadcast_to(jnp.asarray(fill, jnp.int32), (B,))[:, None]
    return jnp.where(col < count[:, None], kept, fill), count


def _first(bad):
    """(any, row, segment) of the first True of bad [B, N] (row-major)."""
    flat = jnp.argmax(bad.reshape(-1))
    return jnp.any(bad), flat // bad.shape[1], flat % bad.shape[1]


def check_descriptor(q_lens, kv_lens, q_offsets, kv_offsets, *, seqlen_q: int, seqlen_kv: int,
                     thd: bool, padding: bool, q_runs=None, kv_runs=None,
                     runs_of: str = "segment ids", caller: str = "fused_attn"):
    """checkify checks that a call's descriptor is valid, so that no clamping changes it.

    q_lens / kv_lens int32 [B, M], q_offsets / kv_offsets int32 [B, M + 1]; q_runs /
    kv_runs int32 [B] or None (SequenceDescriptor.q_runs; runs_of says what they count:
    "segment ids" runs or "seqlens" non-negative entries). Checked per side, in this
    order: (THD) offsets inside [0, S], offsets in order (non-decreasing), (padding masks)
    lengths >= 0, a segment past the end of the buffer (THD: offset + length > S; BSHD:
    length > S), (THD) a segment running into the next one (offset + length >
    offsets[s + 1], an overlap), and more segments (id runs, or non-negative lengths of a
    compacted descriptor) than max_segments_per_seq.

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
            if runs_of == "seqlens":
                checkify.check(~bad, where + "_seqlens of row {b} hold {v} segments (non-negative "
                               f"entries), more than max_segments_per_seq={M} (those past it "
                               "would be dropped)", b=b, v=runs[b, 0])
            else:
                checkify.check(~bad, where + " segment ids of row {b} hold {v} runs, more than "
                               f"max_segments_per_seq={M} (the runs past it would be dropped)",
                               b=b, v=runs[b, 0])
