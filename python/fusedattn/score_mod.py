"""score_mod: a plain JAX function on scalars, lowered to a small expression program.

fused_attn(..., score_mod=fn, score_mod_operands=(...)) changes every attention score
inside the kernel: s' = fn(s, batch_idx, head_idx, q_idx, kv_idx, *operands), where s is
the scaled (and biased) logit, the indices are int32 positions (head_idx the q head) and
each operand is read at [batch_idx, head_idx, q_idx, kv_idx] of its broadcast shape. fn
is written with jax.numpy on scalars, as for PyTorch's FlexAttention. Masks still apply
after fn (a score fn sets to -inf is dropped), and max_logit is taken after fn.

fn is traced once (jax.make_jaxpr) into a Program: straight-line float32 code over
registers, which the C++ engines interpret per tile row. The backward program is the
derivative of fn with respect to the score, traced the same way from jax.grad (or the
caller's score_mod_bprop), and each array operand gets its own derivative program.

Program encoding (csrc/fusedattn/score_mod/program.h reads it): int32 words
  [kVersion, n_inputs, n_instr, out_reg, (op, a, b, c) * n_instr]
and a float32 constant table. Registers 0 .. n_inputs-1 are the inputs (score, batch,
head, q, kv, the array operands, then dscore for the backward programs); instruction i
writes register n_inputs + i. Every value is float32: integer index arithmetic is exact
below 2^24, comparisons give 1 or 0.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable

import jax
from jax.extend.core import Literal as _Literal
import jax.numpy as jnp
import numpy as np

from .reference import block_positions

__all__ = ["Op", "Program", "ScoreMod", "lower", "make_score_mod"]

VERSION = 1
INDEX_INPUTS = 5  # score, batch_idx, head_idx, q_idx, kv_idx


class Op(enum.IntEnum):
    """Opcodes; mirror of ScoreModOp in csrc/fusedattn/score_mod/program.h (same values)."""

    CONST = 0      # constant table[a]
    ADD = 1
    SUB = 2
    MUL = 3
    DIV = 4
    MAX = 5
    MIN = 6
    NEG = 7
    ABS = 8
    EXP = 9
    LOG = 10
    TANH = 11
    SIGMOID = 12
    LT = 13
    LE = 14
    GT = 15
    GE = 16
    EQ = 17
    NE = 18
    SELECT = 19    # a != 0 ? b : c
    SQRT = 20
    RSQRT = 21
    SIGN = 22
    LOG1P = 23
    EXPM1 = 24
    POW = 25
    FLOOR = 26
    CEIL = 27
    TRUNC = 28     # toward zero (float -> int conversion)
    REM = 29       # fmod (C / lax.rem semantics)
    EXP2 = 30
    SIN = 31
    COS = 32
    ERF = 33


_BINARY = {"add": Op.ADD, "add_any": Op.ADD, "sub": Op.SUB, "mul": Op.MUL, "max": Op.MAX, "min": Op.MIN,
           "lt": Op.LT, "le": Op.LE, "gt": Op.GT, "ge": Op.GE, "eq": Op.EQ, "ne": Op.NE,
           "pow": Op.POW, "rem": Op.REM}
_UNARY = {"neg": Op.NEG, "abs": Op.ABS, "exp": Op.EXP, "log": Op.LOG, "tanh": Op.TANH,
          "logistic": Op.SIGMOID, "sqrt": Op.SQRT, "rsqrt": Op.RSQRT, "sign": Op.SIGN,
          "log1p": Op.LOG1P, "expm1": Op.EXPM1, "floor": Op.FLOOR, "ceil": Op.CEIL,
          "exp2": Op.EXP2, "sin": Op.SIN, "cos": Op.COS, "erf": Op.ERF}
_IDENTITY = {"copy", "copy_p", "reduce_precision", "optimization_barrier"}
_SHAPE_ONLY = {"broadcast_in_dim", "reshape", "squeeze", "expand_dims"}
_CALLS = {"pjit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call",
          "custom_vjp_call", "custom_vjp_call_jaxpr", "jit"}
SUPPORTED = sorted(set(_BINARY) | set(_UNARY) | _IDENTITY | _SHAPE_ONLY | {
    "div", "select_n", "integer_pow", "square", "one_minus_square", "convert_element_type",
    "and", "or", "not",
    "clamp", "stop_gradient", "pjit"})


class ScoreModError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Program:
    """One lowered function: int32 code words and float32 constants (hashable)."""

    code: tuple[int, ...]
    consts: tuple[float, ...]

    @property
    def n_inputs(self) -> int:
        return self.code[1]

    def evaluate(self, *inputs):
        """Runs the program with numpy (float32), elementwise over broadcast inputs: the
        Python twin of the C++ interpreter, for tests."""
        regs = [np.asarray(x, np.float32) for x in inputs]
        assert len(regs) == self.n_inputs
        n = self.code[2]
        f = np.float32
        with np.errstate(all="ignore"):
            for i in range(n):
                op, a, b, c = self.code[4 + 4 * i: 8 + 4 * i]
                x = regs[a] if op != Op.CONST else None
                y = regs[b] if op in _TWO_ARGS else None
                regs.append(np.asarray(_NP[Op(op)](self, x, y, regs[c] if op == Op.SELECT
                                                   else None, a), f))
        return regs[self.code[3]]


_TWO_ARGS = {Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN, Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ,
             Op.NE, Op.POW, Op.REM, Op.SELECT}


def _erf(x):
    import math
    return np.vectorize(math.erf, otypes=[np.float32])(x)


_NP = {
    Op.CONST: lambda p, x, y, z, a: np.float32(p.consts[a]),
    Op.ADD: lambda p, x, y, z, a: x + y, Op.SUB: lambda p, x, y, z, a: x - y,
    Op.MUL: lambda p, x, y, z, a: x * y, Op.DIV: lambda p, x, y, z, a: x / y,
    Op.MAX: lambda p, x, y, z, a: np.maximum(x, y), Op.MIN: lambda p, x, y, z, a: np.minimum(x, y),
    Op.NEG: lambda p, x, y, z, a: -x, Op.ABS: lambda p, x, y, z, a: np.abs(x),
    Op.EXP: lambda p, x, y, z, a: np.exp(x), Op.LOG: lambda p, x, y, z, a: np.log(x),
    Op.TANH: lambda p, x, y, z, a: np.tanh(x),
    Op.SIGMOID: lambda p, x, y, z, a: 1 / (1 + np.exp(-x)),
    Op.LT: lambda p, x, y, z, a: x < y, Op.LE: lambda p, x, y, z, a: x <= y,
    Op.GT: lambda p, x, y, z, a: x > y, Op.GE: lambda p, x, y, z, a: x >= y,
    Op.EQ: lambda p, x, y, z, a: x == y, Op.NE: lambda p, x, y, z, a: x != y,
    Op.SELECT: lambda p, x, y, z, a: np.where(x != 0, y, z),
    Op.SQRT: lambda p, x, y, z, a: np.sqrt(x), Op.RSQRT: lambda p, x, y, z, a: 1 / np.sqrt(x),
    Op.SIGN: lambda p, x, y, z, a: np.sign(x), Op.LOG1P: lambda p, x, y, z, a: np.log1p(x),
    Op.EXPM1: lambda p, x, y, z, a: np.expm1(x), Op.POW: lambda p, x, y, z, a: np.power(x, y),
    Op.FLOOR: lambda p, x, y, z, a: np.floor(x), Op.CEIL: lambda p, x, y, z, a: np.ceil(x),
    Op.TRUNC: lambda p, x, y, z, a: np.trunc(x), Op.REM: lambda p, x, y, z, a: np.fmod(x, y),
    Op.EXP2: lambda p, x, y, z, a: np.exp2(x), Op.SIN: lambda p, x, y, z, a: np.sin(x),
    Op.COS: lambda p, x, y, z, a: np.cos(x), Op.ERF: lambda p, x, y, z, a: _erf(x),
}


class _Builder:
    def __init__(self, n_inputs: int):
        self.n_inputs = n_inputs
        self.instr: list[tuple[int, int, int, int]] = []
        self.consts: list[float] = []
        self._const_reg: dict[float, int] = {}

    def emit(self, op: Op, a: int = 0, b: int = 0, c: int = 0) -> int:
        self.instr.append((int(op), a, b, c))
        return self.n_inputs + len(self.instr) - 1

    def const(self, value) -> int:
        v = float(np.float32(value))
        key = (v, np.signbit(v)) if v == v else ("nan",)
        if key not in self._const_reg:
            self.consts.append(v)
            self._const_reg[key] = self.emit(Op.CONST, len(self.consts) - 1)
        return self._const_reg[key]

    def program(self, out: int) -> Program:
        code = [VERSION, self.n_inputs, len(self.instr), out]
        for ins in self.instr:
            code.extend(ins)
        return Program(tuple(int(x) for x in code), tuple(self.consts))


def _is_int(aval) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.integer) or aval.dtype == jnp.bool_


def _lower_jaxpr(jaxpr, consts, in_regs, bld: _Builder, what: str) -> list[int]:
    env: dict[Any, int] = {}

    def read(v):
        if isinstance(v, _Literal):
            return bld.const(np.asarray(v.val))
        return env[v]

    def scalar(v, where):
        shape = getattr(v.aval, "shape", ())
        if shape != ():
            raise ScoreModError(f"{what}: works on scalars; {where} has shape {shape} (the "
                                "function is traced with scalar score, indices and operand "
                                "elements: no reductions, no array operations)")

    for var, c in zip(jaxpr.constvars, consts):
        c = np.asarray(c)
        if c.shape != ():
            raise ScoreModError(f"{what}: captures an array constant of shape {c.shape}; pass "
                                "arrays as score_mod_operands instead")
        env[var] = bld.const(c)
    for var, r in zip(jaxpr.invars, in_regs):
        env[var] = r

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        for v in eqn.outvars:
            scalar(v, f"the result of {name!r}")
        args = [read(v) for v in eqn.invars]
        out_int = _is_int(eqn.outvars[0].aval) if eqn.outvars else False
        if name in _CALLS:
            sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr", eqn.params.get("fun_jaxpr")))
            if sub is None:
                raise ScoreModError(f"{what}: cannot inline {name!r}")
            inner = getattr(sub, "jaxpr", sub)
            inner_consts = getattr(sub, "consts", getattr(sub, "literals", []))
            n = len(inner.invars)
            outs = _lower_jaxpr(inner, inner_consts, args[-n:] if n else [], bld, what)
        elif _BINARY.get(name) is not None:
            outs = [bld.emit(_BINARY[name], args[0], args[1])]
        elif name == "div":
            r = bld.emit(Op.DIV, args[0], args[1])
            outs = [bld.emit(Op.TRUNC, r) if out_int else r]  # lax.div rounds ints to zero
        elif name in _UNARY:
            outs = [bld.emit(_UNARY[name], args[0])]
        elif name in _IDENTITY or name in _SHAPE_ONLY or name == "stop_gradient":
            outs = [args[0]]
        elif name == "square":
            outs = [bld.emit(Op.MUL, args[0], args[0])]
        elif name == "one_minus_square":  # jax >= 0.11: tanh's derivative
            outs = [bld.emit(Op.SUB, bld.const(1.0), bld.emit(Op.MUL, args[0], args[0]))]
        elif name == "integer_pow":
            outs = [bld.emit(Op.POW, args[0], bld.const(eqn.params["y"]))]
        elif name == "select_n":
            if len(args) != 3:
                raise ScoreModError(f"{what}: select_n with {len(args) - 1} cases; only two "
                                    "(jnp.where / lax.select) are supported")
            outs = [bld.emit(Op.SELECT, args[0], args[2], args[1])]  # case 1 where pred
        elif name == "clamp":  # clamp(lo, x, hi)
            outs = [bld.emit(Op.MIN, bld.emit(Op.MAX, args[1], args[0]), args[2])]
        elif name == "convert_element_type":
            dst = eqn.params["new_dtype"]
            if dst == jnp.bool_:
                outs = [bld.emit(Op.NE, args[0], bld.const(0.0))]
            elif jnp.issubdtype(dst, jnp.integer) and not _is_int(eqn.invars[0].aval):
                outs = [bld.emit(Op.TRUNC, args[0])]
            else:
                outs = [args[0]]
        elif name in ("and", "or", "not"):
            if any(v.aval.dtype != jnp.bool_ for v in eqn.invars):
                raise ScoreModError(f"{what}: bitwise {name!r} on integers is not supported "
                                    "(only on booleans)")
            if name == "and":
                outs = [bld.emit(Op.MUL, args[0], args[1])]
            elif name == "or":
                outs = [bld.emit(Op.MAX, args[0], args[1])]
            else:
                outs = [bld.emit(Op.EQ, args[0], bld.const(0.0))]
        else:
            raise ScoreModError(
                f"{what}: operation {name!r} is not supported inside the kernel; supported: "
                f"{', '.join(SUPPORTED)}")
        for v, r in zip(eqn.outvars, outs):
            env[v] = r
    return [read(v) for v in jaxpr.outvars]


def lower(fn: Callable, n_array_operands: int, *, extra_dscore: bool = False,
          what: str = "score_mod") -> Program:
    """Traces fn(score f32, batch i32, head i32, q i32, kv i32, *array operands f32
    [, dscore f32]) -> scalar float and lowers it to a Program."""
    args = ([jnp.float32(0.5)] + [jnp.int32(0)] * 4 + [jnp.float32(0.5)] * n_array_operands +
            ([jnp.float32(1.0)] if extra_dscore else []))
    try:
        closed = jax.make_jaxpr(fn)(*args)
    except Exception as e:  # a function that does not trace on scalars
        raise ScoreModError(f"{what}: tracing it on scalars failed: {type(e).__name__}: {e}") from e
    outs = closed.out_avals
    if len(outs) != 1 or outs[0].shape != () or not jnp.issubdtype(outs[0].dtype, jnp.floating):
        got = ", ".join(f"{a.dtype}{list(a.shape)}" for a in outs)
        raise ScoreModError(f"{what}: must return one float scalar (the new score); got {got}")
    bld = _Builder(len(args))
    (out,) = _lower_jaxpr(closed.jaxpr, closed.consts, list(range(len(args))), bld, what)
    if out < len(args):  # the output is an input: copy it so out_reg is an instruction
        out = bld.emit(Op.ADD, out, bld.const(0.0))
    return bld.program(out)


@dataclasses.dataclass(frozen=True)
class ScoreMod:
    """A lowered score_mod (static, hashable: part of the call's config and of the GPU
    graph cache key): forward program, backward program (dscore -> dscore of the input
    score) and one gradient program per array operand, plus each array operand's shape."""

    fwd: Program
    bwd: Program
    operand_grads: tuple[Program, ...]
    operand_shapes: tuple[tuple[int, int, int, int], ...]
    # The backward program cuDNN's graph runs: ds * f' without bwd's zero-derivative guard
    # (its compare and select, two more pointwise nodes, made cuDNN's backward 2x slower on
    # the H100: softcap fwd+bwd 2.42 -> 4.18 ms at S 4096, 2026-11-25).
    gpu_bwd: Program
    fn: Callable = dataclasses.field(compare=False, hash=False, repr=False)
    scalars: tuple = dataclasses.field(compare=False, hash=False, repr=False, default=())


def _split_operands(operands):
    """-> (array operands, positions), scalars (position -> value)."""
    arrays, slots, scalars = [], [], {}
    for i, x in enumerate(operands):
        if isinstance(x, (int, float, np.integer, np.floating)) or (
                isinstance(x, np.ndarray) and x.shape == ()):
            scalars[i] = float(x)
        else:
            arrays.append(x)
            slots.append(i)
    return arrays, slots, scalars


def make_score_mod(fn, operands, bprop, shape4) -> tuple[ScoreMod, list]:
    """Lowers fn (and bprop) for operands; returns the ScoreMod and the array operands
    as float32 [.., 4-d broadcastable] arrays (ShapeDtypeStructs for ShapeDtypeStruct
    operands). shape4 = (B, Hq, Sq, Skv)."""
    if not callable(fn):
        raise ValueError(f"fused_attn: score_mod must be a function; got {type(fn).__name__}")
    if bprop is not None and not callable(bprop):
        raise ValueError("fused_attn: score_mod_bprop must be a function or None")
    operands = tuple(operands or ())
    arrays, slots, scalars = _split_operands(operands)
    n_ops = len(operands)
    shapes, arrays4 = [], []
    for i, x in zip(slots, arrays):
        shp = tuple(np.shape(x))
        if len(shp) > 4:
            raise ValueError(f"fused_attn: score_mod_operands[{i}] has shape {shp}; allowed "
                             f"shapes broadcast to [B, Hq, Sq, Skv] = {list(shape4)}")
        s4 = (1,) * (4 - len(shp)) + shp
        if any(d not in (1, full) for d, full in zip(s4, shape4)):
            raise ValueError(f"fused_attn: score_mod_operands[{i}] has shape {shp}; allowed "
                             f"shapes broadcast to [B, Hq, Sq, Skv] = {list(shape4)} (each "
                             "dimension 1 or full)")
        if not jnp.issubdtype(jnp.result_type(x), jnp.number):
            raise ValueError(f"fused_attn: score_mod_operands[{i}] must be numeric; got "
                             f"{jnp.result_type(x)}")
        shapes.append(s4)
        if isinstance(x, jax.ShapeDtypeStruct):  # get_backend asks with shapes only
            arrays4.append(jax.ShapeDtypeStruct(s4, jnp.float32))
        else:
            arrays4.append(jnp.reshape(jnp.asarray(x, jnp.float32), s4))

    def _chain(ds, d):
        # A zero derivative passes no cotangent, NaN or not, as JAX's own VJP of
        # jnp.where does: a score fn set to NaN (or -inf) on some entries gives the raw
        # score there no gradient, where ds * 0 would be NaN.
        return jnp.where(d == 0.0, 0.0, ds * d)

    def full_args(arr):
        it = iter(arr)
        return [scalars[i] if i in scalars else next(it) for i in range(n_ops)]

    def f(s, b, h, qi, ki, *arr):
        return fn(s, b, h, qi, ki, *full_args(arr))

    n_arr = len(arrays)
    fwd = lower(f, n_arr)
    if bprop is None:
        def back(s, b, h, qi, ki, *rest):
            arr, ds = rest[:-1], rest[-1]
            return _chain(ds, jax.grad(f, argnums=0)(s, b, h, qi, ki, *arr))
    else:
        def back(s, b, h, qi, ki, *rest):
            arr, ds = rest[:-1], rest[-1]
            return bprop(ds, s, b, h, qi, ki, *full_args(arr))
    what = "score_mod_bprop" if bprop is not None else "the derivative of score_mod"
    bwd = lower(back, n_arr, extra_dscore=True, what=what)
    gpu_bwd = bwd
    if bprop is None:
        def back_product(s, b, h, qi, ki, *rest):
            arr, ds = rest[:-1], rest[-1]
            return ds * jax.grad(f, argnums=0)(s, b, h, qi, ki, *arr)
        gpu_bwd = lower(back_product, n_arr, extra_dscore=True, what=what)
    grads = []
    for j in range(n_arr):
        def g(s, b, h, qi, ki, *rest, j=j):
            arr, ds = rest[:-1], rest[-1]
            return _chain(ds, jax.grad(f, argnums=INDEX_INPUTS + j)(s, b, h, qi, ki, *arr))
        grads.append(lower(g, n_arr, extra_dscore=True,
                           what=f"the derivative of score_mod by operand {slots[j]}"))
    sm = ScoreMod(fwd, bwd, tuple(grads), tuple(shapes), gpu_bwd, fn=f)
    return sm, arrays4


def apply_reference(sm_fn: Callable, s, arrays4, q_pos=None, kv_pos=None, index_base=None):
    """s' = fn over materialized scores s [B, Hq, Sq, Skv] (float32), with vmap (the
    reference path). q_pos [B, Sq] / kv_pos [B, Sq, Skv] (reference.sequence_positions):
    the q_idx and kv_idx fn sees, and where the operands are read; None (or plain
    aranges) in BSHD layouts, where they are the grid's own indices. index_base: None, or
    (batch_base, head_base) of a shard (int32 [2], maybe traced), added to the batch_idx
    and head_idx fn sees, or (batch_base, head_base, q_pos, kv_pos, q_extent, kv_extent[,
    stripe, stride]) of a block of a bigger call (int32 [6] or [8]): in BSHD layouts
    (q_pos None) fn then sees the block's global tokens (reference.block_positions) as
    q_idx and kv_idx, in THD ones the given positions (sequence_positions(block=)). The
    operands are the shard's own, read at the local index (a THD block's have no
    sequence dim)."""
    B, H, Sq, Skv = s.shape
    idx = [jnp.arange(n, dtype=jnp.int32) for n in (B, H, Sq, Skv)]
    b_glob, h_glob = idx[0], idx[1]
    block = None
    if index_base is not None:
        base = jnp.asarray(index_base).astype(jnp.int32).reshape(-1)
        b_glob, h_glob = idx[0] + base[0], idx[1] + base[1]
        if base.shape[0] > 2:
            block = base[2:]
    if q_pos is None:
        q_idx, kv_idx = (idx[2], idx[3]) if block is None else block_positions(block, Sq, Skv)
        full = [jnp.broadcast_to(a, (B, H, Sq, Skv)) for a in arrays4]
        f = sm_fn
        for axis in range(4):  # innermost first: vmap over kv, then q, head, batch
            f = jax.vmap(f, in_axes=_axes(3 - axis, len(full)))
        return f(s, b_glob, h_glob, q_idx, kv_idx, *full)
    if block is not None and any(a.shape[2] > 1 or a.shape[3] > 1 for a in arrays4):
        raise ValueError(
            "score_mod_operands: a THD block (index_base with positions) takes operands "
            "without a query or key dim ([1|B, 1|Hq, 1, 1]); got shapes "
            f"{[tuple(a.shape) for a in arrays4]}: THD operands are read at the position in "
            "the segment")
    # Positions of a THD segment: every grid element has its own (q_idx, kv_idx), and
    # the operands are gathered there.
    grid = (B, H, Sq, Skv)
    bi = jnp.broadcast_to(idx[0][:, None, None, None], grid)
    hi = jnp.broadcast_to(idx[1][None, :, None, None], grid)
    qi = jnp.broadcast_to(q_pos[:, None, :, None], grid)
    ki = jnp.broadcast_to(kv_pos[:, None], grid)
    full = [a[tuple(jnp.zeros((), jnp.int32) if a.shape[d] == 1 else ix
                    for d, ix in enumerate((bi, hi, qi, ki)))] for a in arrays4]
    full = [jnp.broadcast_to(a, grid) for a in full]
    flat = lambda x: x.reshape(-1)
    bg = jnp.broadcast_to(b_glob[:, None, None, None], grid)
    hg = jnp.broadcast_to(h_glob[None, :, None, None], grid)
    out = jax.vmap(sm_fn)(flat(s), flat(bg), flat(hg), flat(qi), flat(ki), *map(flat, full))
    return out.reshape(grid)


def _axes(dim, n_arr):
    """in_axes of one vmap level over dimension dim (0 batch .. 3 kv) of the score grid:
    the score and operands map their leading remaining axis, index dim maps axis 0."""
    idx_axes = [0 if d == dim else None for d in range(4)]
    return (0, *idx_axes, *([0] * n_arr))


def _program_words(prog: Program) -> list[int]:
    bits = np.asarray(prog.consts, np.float32).view(np.int32).tolist()
    return [len(prog.code), *prog.code, len(bits), *bits]


def packed_attribute(sm: ScoreMod, cuda: bool = False) -> np.ndarray:
    """The int32 attribute the C++ handlers decode (csrc/fusedattn/score_mod/program.h);
    cuda: the CUDA handler's, whose backward program is gpu_bwd."""
    words = [len(sm.operand_shapes)]
    for shp in sm.operand_shapes:
        words.extend(int(d) for d in shp)
    for prog in (sm.fwd, sm.gpu_bwd if cuda else sm.bwd, *sm.operand_grads):
        words.extend(_program_words(prog))
    return np.asarray(words, np.int32)


# Each operand starts at a multiple of this many floats (64 bytes) of the concatenated
# buffer, so that its address suits a GPU tensor (score_mod.h: ScoreMod::offset).
OPERAND_ALIGN = 16


def _padded(n: int) -> int:
    return -(-n // OPERAND_ALIGN) * OPERAND_ALIGN


def concat_operands(arrays4) -> jax.Array:
    """The array operands flattened, each zero-padded to a multiple of OPERAND_ALIGN
    floats, and concatenated (float32 [N]; [0] when none)."""
    if not arrays4:
        return jnp.zeros((0,), jnp.float32)
    return jnp.concatenate([jnp.pad(jnp.ravel(a), (0, _padded(a.size) - a.size))
                            for a in arrays4])


def split_operands(flat, sm: ScoreMod):
    """Inverse of concat_operands: the operands in their 4-d shapes."""
    out, off = [], 0
    for shp in sm.operand_shapes:
        n = int(np.prod(shp))
        out.append(jnp.reshape(flat[off:off + n], shp))
        off += _padded(n)
    return out
