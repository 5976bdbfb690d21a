"""Multi-device partitioning of fusedattn's primitives.

Each primitive (attention forward and backward, small-seq forward and backward, softmax
forward and backward) is a `jax.experimental.custom_partitioning` function with a Shardy
sharding rule (and the GSPMD callbacks, for jax_use_shardy_partitioner=False): under `jit`
on sharded arrays every device runs the primitive on its own shard, with no collective
where the math needs none. The FFI handlers never know: they see a smaller call.

A primitive names the role of every dimension of its operands and results:
  "v0", "v1", ...  leading vmap dimensions (vmap broadcasts them onto every operand)
  "b" batch        "h" query heads     "k" key/value heads
  "s" query sequence (softmax rows)    "c", "ckv": q's and k/v's sequence under context
  parallelism (forced onto the cp axis)  None: anything else (head dim, the packed 3 or 2,
  sequence lengths, segment slots, flat buffers); a size-1 (broadcast) dimension too.
The plan: the mesh axes that shard operand 0's "v*", "b" and "h" dimensions (and "s"
where the primitive allows it) shard every dimension of that role; "k" follows "h" when
the key/value heads divide by the head axes' size (else k and v are replicated over them,
with a one-time warning, and the primitive takes each shard's heads itself). Any other
sharded dimension is gathered by XLA before the call, with a one-time warning naming it:
the sequence dimension is partitioned only by context parallelism, never silently.

Inside shard_map (every mesh axis manual) and on one device the primitive is the plain
per-device call.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from jax import custom_batching
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

Roles = tuple  # one role (str or None) per dimension


def _axes_of(entry) -> tuple[str, ...]:
    """A PartitionSpec entry -> its mesh axes, major first."""
    if entry is None:
        return ()
    if isinstance(entry, (tuple, list)):
        return tuple(a for e in entry for a in _axes_of(e))
    return (entry,)


def _spec_entries(sharding, ndim: int) -> tuple:
    spec = tuple(getattr(sharding, "spec", ()) or ())
    return spec + (None,) * (ndim - len(spec))


def _entry(axes: tuple[str, ...]):
    return None if not axes else axes[0] if len(axes) == 1 else axes


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one call is partitioned: the mesh axes of each role (major first), and
    whether k and v stay whole over the head axes (their heads did not divide)."""

    mesh: Any
    axes: tuple  # ((role, (axis, ...)), ...)
    kv_replicated: bool = False

    def of(self, role) -> tuple[str, ...]:
        return dict(self.axes).get(role, ())

    def size(self, role) -> int:
        return math.prod(self.mesh.shape[a] for a in self.of(role))

    def index(self, role):
        """This device's shard index along role's axes (traced int32; 0 unsharded)."""
        idx = jnp.int32(0)
        for a in self.of(role):
            idx = idx * self.mesh.shape[a] + jax.lax.axis_index(a)
        return idx

    def reduce_axes(self, *roles) -> tuple[str, ...]:
        return tuple(a for r in roles for a in self.of(r))

    def spec(self, roles: Roles, shape) -> PartitionSpec:
        return PartitionSpec(*(_entry(self.of(r)) if r is not None and d > 1 else None
                               for r, d in zip(roles, shape)))


_warned: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)


_ROLE_NAMES = {"b": "batch", "h": "heads", "k": "kv heads", "s": "sequence", "t": "kv sequence",
               "c": "context-parallel sequence", "ckv": "context-parallel kv sequence"}


def _role_name(role) -> str:
    if role is None:
        return "a dimension it does not partition"
    if role.startswith("v"):
        return "a vmap dimension"
    return f"the {_ROLE_NAMES.get(role, role)} dimension"


class Partitioned:
    """A primitive: impl(static, plan, *args) -> tuple of results, on local shards (plan
    None: one device). roles(static, arg_shapes, result_shapes) -> (arg roles, result
    roles). shardable: the roles of operand 0 whose mesh axes are followed (besides the
    vmap dims). names: the operands' names (or names(static)), for the warnings."""

    def __init__(self, name: str, impl: Callable, roles: Callable,
                 names: Sequence[str], shardable=("b", "h"), forced: Callable | None = None):
        self.name, self.impl, self.roles = name, impl, roles
        # forced(static, mesh) -> {role: axes}: roles sharded whatever operand 0's spec
        # says (context parallelism's sequence dims); their axes leave the other roles.
        self.forced = forced or (lambda static, mesh: {})
        self.names = names if callable(names) else (lambda static, n=tuple(names): n)
        self.shardable = tuple(shardable)
        part = custom_partitioning(self._body, static_argnums=(0,))
        part.def_partition(partition=self._partition,
                           infer_sharding_from_operands=self._infer,
                           sharding_rule=self._rule)
        self._part = part

    def _body(self, static, *args):
        return tuple(self.impl(static, None, *args))

    def __call__(self, static, *args):
        """The results (a tuple); vmap-able (every operand gets the vmap dims)."""
        @custom_batching.custom_vmap
        def call(*a):
            return self._part(static, *a)

        @call.def_vmap
        def _vmap(axis_size, in_batched, *a):
            a = [x if bat else jnp.broadcast_to(x, (axis_size,) + x.shape)
                 for x, bat in zip(a, in_batched)]
            out = call(*a)
            return out, tuple(True for _ in out)

        return call(*args)

    # -- the plan ---------------------------------------------------------------------

    def _plan(self, static, mesh, arg_shapes, arg_shardings, arg_roles) -> Plan:
        q_roles, q_shape = arg_roles[0], arg_shapes[0]
        q_spec = _spec_entries(arg_shardings[0], len(q_shape))
        axes: dict = {}
        for d, role in enumerate(q_roles):
            if role is None or not (role.startswith("v") or role in self.shardable):
                continue
            ax = _axes_of(q_spec[d])
            n = math.prod(mesh.shape[a] for a in ax)
            if ax and q_shape[d] % n:
                warn_once(f"fusedattn.{self.name}: {self.names(static)[0]}'s {_role_name(role)} "
                          f"({q_shape[d]}) does not divide by its mesh axes {ax} ({n} shards); "
                          "it is gathered")
                ax = ()
            if ax:
                axes[role] = ax
        forced = self.forced(static, mesh)
        taken = {a for ax in forced.values() for a in ax}
        axes = {r: tuple(a for a in ax if a not in taken) for r, ax in axes.items()}
        axes = {r: ax for r, ax in axes.items() if ax}
        axes.update(forced)
        kv_replicated = False
        if "h" in axes:
            kv = [shape[d] for roles, shape in zip(arg_roles, arg_shapes)
                  for d, r in enumerate(roles) if r == "k"]
            n = math.prod(mesh.shape[a] for a in axes["h"])
            if kv and kv[0] % n == 0:
                axes["k"] = axes["h"]
            elif kv:
                kv_replicated = True
                warn_once(f"fusedattn.{self.name}: the {kv[0]} kv heads do not divide by the "
                          f"{n} shards of the head axes {axes['h']}; k and v are replicated "
                          "over them (each device takes the kv heads its q heads use)")
        plan = Plan(mesh, tuple(sorted(axes.items())), kv_replicated)
        names = self.names(static)
        for i, (roles, shape, sh) in enumerate(zip(arg_roles, arg_shapes, arg_shardings)):
            entries = _spec_entries(sh, len(shape))
            for d, (role, entry) in enumerate(zip(roles, entries)):
                have = _axes_of(entry)
                want = plan.of(role) if role is not None and shape[d] > 1 else ()
                if have and have != want:
                    name = names[i] if i < len(names) else f"operand {i}"
                    warn_once(f"fusedattn.{self.name}: {name}'s dimension {d} "
                              f"({_role_name(role)}) is sharded over {have}; {self.name} "
                              f"does not partition it that way, so XLA gathers it first "
                              "(the sequence dimension: use context parallelism)")
        return plan

    def _planned(self, static, mesh, arg_infos, result_infos):
        """(plan, arg shardings, result shardings) of a call's shapes and shardings."""
        arg_shapes = [tuple(x.shape) for x in arg_infos]
        res_shapes = [tuple(x.shape) for x in result_infos]
        arg_roles, res_roles = self.roles(static, arg_shapes, res_shapes)
        plan = self._plan(static, mesh, arg_shapes, [a.sharding for a in arg_infos], arg_roles)
        shard = lambda roles, shapes: tuple(NamedSharding(mesh, plan.spec(r, s))
                                            for r, s in zip(roles, shapes))
        return plan, shard(arg_roles, arg_shapes), shard(res_roles, res_shapes)

    def _partition(self, static, mesh, arg_infos, result_infos):
        plan, arg_sh, res_sh = self._planned(static, mesh, arg_infos, result_infos)

        def lower(*args):
            return tuple(self.impl(static, plan, *args))

        return mesh, lower, res_sh, arg_sh

    def _infer(self, static, mesh, arg_infos, result_infos):
        return self._planned(static, mesh, arg_infos, result_infos)[2]

    def _rule(self, static, mesh, value_types, result_types):
        arg_shapes = [tuple(t.shape) for t in value_types]
        res_shapes = [tuple(t.shape) for t in result_types]
        arg_roles, res_roles = self.roles(static, arg_shapes, res_shapes)
        counter = itertools.count()

        def factors(roles, shape):
            names = []
            for r, d in zip(roles, shape):
                if r is None or d == 1:
                    names.append(f"u{next(counter)}")
                else:
                    names.append(r)
            return " ".join(names)

        ins = ", ".join(factors(r, s) for r, s in zip(arg_roles, arg_shapes))
        outs = ", ".join(factors(r, s) for r, s in zip(res_roles, res_shapes))
        return f"{ins} -> {outs}"


def lead(n: int) -> tuple:
    """The roles of n leading vmap dims."""
    return tuple(f"v{i}" for i in range(n))


def per_slice(fn: Callable, n_lead: int) -> Callable:
    """fn over arrays without the vmap dims -> over arrays with n_lead of them."""
    for _ in range(n_lead):
        fn = jax.vmap(fn)
    return fn


def take_kv_heads(plan: Plan | None, axis: int, hq_local: int, hq: int, hkv: int, *xs):
    """k / v replicated over the head axes (their heads did not divide): each device's
    slice of the kv heads its q heads [h0, h0 + hq_local) use, along axis. Returns the
    head indices taken (None: nothing to take) and the sliced arrays."""
    if plan is None or not plan.kv_replicated:
        return None, xs
    group = hq // hkv
    h0 = plan.index("h") * hq_local
    if group % hq_local == 0:  # this device's q heads share one kv head
        idx = (h0 // group)[None]
    else:  # each q head its own copy of its kv head (plain multi-head locally)
        idx = (h0 + jnp.arange(hq_local, dtype=jnp.int32)) // group
    return idx, tuple(jnp.take(x, idx, axis=axis) for x in xs)


def put_kv_heads(plan: Plan, idx, axis: int, hkv: int, *dxs):
    """The gradients of take_kv_heads' slices back in the whole kv heads, summed over
    the head axes (every device holds the replicated k / v)."""
    out = []
    for dx in dxs:
        shape = list(dx.shape)
        shape[axis] = hkv
        full = jnp.zeros(shape, jnp.float32)
        moved = jnp.moveaxis(full, axis, 0).at[idx].add(
            jnp.moveaxis(dx.astype(jnp.float32), axis, 0))
        full = jnp.moveaxis(moved, 0, axis)
        out.append(jax.lax.psum(full, plan.of("h")).astype(dx.dtype))
    return tuple(out)


def _varying(x) -> frozenset:
    """The manual mesh axes x varies over (jax's aval.mat.varying; older jax: aval.vma)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)
    if mat is not None:
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", ()))


def vary_like(results, *inputs):
    """An FFI call's results carry no varying-manual-axes type (shard_map's and a
    partitioned primitive's vma); mark them varying over every manual axis their inputs
    vary over, as the computation they stand for would be. results: any pytree of arrays."""
    vma = frozenset().union(*(_varying(x) for x in inputs))
    if not vma:
        return results

    def mark(r):
        missing = tuple(sorted(vma - _varying(r)))
        return jax.lax.pcast(r, missing, to="varying") if missing else r

    return jax.tree.map(mark, results)
