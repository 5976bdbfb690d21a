"""Every JAX transformation over a fused op: the fused kernels for the first order, a
plain-JAX reference for the rest.

An op is three functions of a hashable `static` and its operands:
  fwd(static, training, *ops) -> (out, *stats)   the fused forward (stats: no gradient)
  bwd(static, *ops, out, dout, *stats) -> grads  the fused backward: one gradient per
                                                 differentiable operand (diff(static, ops))
  ref(static, *ops) -> out                       the same math in plain JAX (the oracle)

`Differentiable(...)` makes them one function that JAX differentiates in every mode:
* `grad`, `vjp` (first-order reverse mode): the fused forward, then the fused backward.
* `jvp`, `jacfwd`, `linearize` (forward mode): the fused forward gives the primal output;
  the tangent is the reference's JVP (plain JAX: the scores materialize, O(Sq * Skv)
  memory per head).
* grad of grad, `hessian`, jvp of grad: the fused backward's own derivative is the
  reference's (jax.jvp of the reference's VJP), so every higher order is exact.
* `vmap`, `jit`, `checkpoint`, sharding: as the fused functions allow.
* Gradients nobody takes: the rule sees which operands' tangents are symbolic zeros
  (custom_jvp's symbolic_zeros) and gives `specialize(static, live)` the others, so the
  op can ask its kernels for less (attention: no dbias for a constant bias, and on the GPU
  the kernels that compute a score_mod operand's gradient only when it is taken).

How: a `custom_jvp` whose rule returns the fused forward's output and, as its tangent, a
primitive that is linear in the operands' tangents. Its evaluation is the reference's
JVP; its transpose (what reverse mode runs) is the fused backward; its derivative in
the residual operands (higher orders) is plain JAX again. JAX's `custom_vjp` cannot do
this: it refuses forward mode, and its backward is not differentiable.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir


def _zero(t) -> bool:
    """A symbolic zero tangent (custom_jvp's symbolic_zeros)."""
    return isinstance(t, SymbolicZero) or type(t) is ad.Zero


def _vmapped(fn, n_batch: int):
    for _ in range(n_batch):
        fn = jax.vmap(fn)
    return fn


class Differentiable:
    """fwd / bwd / ref (see the module docstring) as one differentiable function
    `self(static, training, *ops) -> (out, *stats)`. diff(static, n_ops) gives the
    positions of the differentiable operands (floating arrays), in bwd's order."""

    def __init__(self, name: str, fwd, bwd, ref, diff, checkpoint_name=None, specialize=None):
        self.fwd, self.bwd, self.ref, self.diff = fwd, bwd, ref, diff
        # checkpoint_name(static) -> str | None: the name the forward's results (the
        # backward's residuals) carry, so a remat policy naming it keeps them.
        self.checkpoint_name = checkpoint_name
        # specialize(static, live) -> static: the static of a call whose differentiable
        # operands at positions `live` have tangents (the others' are symbolic zeros: no
        # gradient is wanted for them, so the kernels may skip computing it).
        self.specialize = specialize
        self.call = jax.custom_jvp(self._primal, nondiff_argnums=(0, 1))
        self.call.defjvp(self._jvp, symbolic_zeros=True)
        self.backward = jax.custom_jvp(self._bwd_primal, nondiff_argnums=(0, 1))
        self.backward.defjvp(self._bwd_jvp)

        self.tangent_p = p = Primitive(f"{name}_tangent")
        p.def_impl(self._tangent_impl)
        p.def_abstract_eval(lambda *a, n_ops, **_: jax.core.ShapedArray(a[n_ops].shape,
                                                                         a[n_ops].dtype))
        mlir.register_lowering(p, mlir.lower_fun(self._tangent_impl, multiple_results=False))
        ad.primitive_jvps[p] = self._tangent_jvp
        ad.primitive_transposes[p] = self._tangent_transpose
        batching.primitive_batchers[p] = self._tangent_batch

    def __call__(self, static, training: bool, *ops):
        return self.call(static, training, *ops)

    # -- the primal and its JVP rule --------------------------------------------------

    def _primal(self, static, training, *ops):
        return self.fwd(static, training, *ops)

    def _jvp(self, static, training, primals, tangents):
        idx = self.diff(static, len(primals))
        if self.specialize is not None:
            static = self.specialize(static, tuple(i for i in idx if not _zero(tangents[i])))
        results = self.call(static, True, *primals)  # differentiable at an outer level too
        label = self.checkpoint_name(static) if self.checkpoint_name else None
        if label is not None:
            results = tuple(checkpoint_name(x, label) for x in results)
        out = results[0]
        lin = [jnp.zeros_like(primals[i]) if _zero(tangents[i]) else tangents[i] for i in idx]
        t_out = self.tangent_p.bind(*primals, out, *results[1:], *lin, static=static,
                                    n_ops=len(primals), n_stats=len(results) - 1, n_batch=0)
        return results, (t_out, *(jnp.zeros_like(s) for s in results[1:]))

    # -- the tangent primitive --------------------------------------------------------

    def _ref_tangent(self, *args, static, n_ops, n_stats):
        """The reference's JVP: the tangent of out, given the operands' tangents."""
        ops, lin = args[:n_ops], args[n_ops + 1 + n_stats:]
        idx = self.diff(static, n_ops)
        return jax.jvp(self._out_of(static, ops, idx), [ops[i] for i in idx], list(lin))[1]

    def _out_of(self, static, ops, idx):
        def out_of(*d):
            full = list(ops)
            for i, x in zip(idx, d):
                full[i] = x
            return self.ref(static, *full)
        return out_of

    def _tangent_impl(self, *args, static, n_ops, n_stats, n_batch):
        fn = functools.partial(self._ref_tangent, static=static, n_ops=n_ops, n_stats=n_stats)
        return _vmapped(fn, n_batch)(*args)

    def _tangent_jvp(self, primals, tangents, *, static, n_ops, n_stats, n_batch):
        # Linear in the operands' tangents; in the residuals (a higher order), the
        # reference's second derivative.
        fn = functools.partial(self._tangent_impl, static=static, n_ops=n_ops, n_stats=n_stats,
                               n_batch=n_batch)
        tangents = [ad.instantiate_zeros(t) for t in tangents]
        return jax.jvp(fn, list(primals), tangents)

    def _tangent_transpose(self, ct, *args, static, n_ops, n_stats, n_batch):
        n_res = n_ops + 1 + n_stats
        res, lin = args[:n_res], args[n_res:]
        if type(ct) is ad.Zero:
            return [None] * n_res + [ad.Zero(x.aval) for x in lin]
        ops, out, stats = res[:n_ops], res[n_ops], res[n_ops + 1:]
        bwd = _vmapped(lambda *a: self.backward(static, n_stats, *a), n_batch)
        grads = bwd(*ops, out, ct, *stats)
        # An operand without a tangent (its zeros a constant, not linear) gets none: the
        # kernels may have skipped its gradient (specialize).
        return [None] * n_res + [g.astype(x.aval.dtype) if ad.is_undefined_primal(x) else None
                                 for g, x in zip(grads, lin)]

    def _tangent_batch(self, args, dims, *, static, n_ops, n_stats, n_batch):
        # Every operand gets the vmap dim in front (as the fused primitives' vmap does).
        size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        moved = [jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
                 for a, d in zip(args, dims)]
        return self.tangent_p.bind(*moved, static=static, n_ops=n_ops, n_stats=n_stats,
                                   n_batch=n_batch + 1), 0

    # -- the backward, differentiable -------------------------------------------------

    def _bwd_primal(self, static, n_stats, *args):
        return tuple(self.bwd(static, *args))

    def _bwd_jvp(self, static, n_stats, primals, tangents):
        # args: *ops, out, dout, *stats. The fused backward is the reference's VJP; its
        # derivative is the reference's (out and stats are functions of the operands).
        grads = self.backward(static, n_stats, *primals)
        n_ops = len(primals) - 2 - n_stats
        ops, dout = primals[:n_ops], primals[n_ops + 1]
        idx = self.diff(static, n_ops)
        out_of = self._out_of(static, ops, idx)

        def ref_vjp(d, dout):
            return tuple(jax.vjp(out_of, *d)[1](dout))

        t_d = [ad.instantiate_zeros(tangents[i]) for i in idx]
        t_dout = ad.instantiate_zeros(tangents[n_ops + 1])
        _, t = jax.jvp(ref_vjp, ([ops[i] for i in idx], dout), (t_d, t_dout))
        return grads, tuple(x.astype(g.dtype) for x, g in zip(t, grads))
