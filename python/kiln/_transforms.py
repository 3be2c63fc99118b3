"""Transformations of Python functions over trees of arrays: grad,
value_and_grad, vjp and jit (JAX's interface), and the lazy mode's scope and
step barrier (torch_xla's), over kiln's C++ transformations."""
from __future__ import annotations

import collections
import functools
from typing import Any, Callable, Sequence

from . import _kiln, tree
from ._array import Array, asarray
from ._kiln import KilnError


def _as_tuple(nums: int | Sequence[int]) -> tuple[int, ...]:
    return (nums,) if isinstance(nums, int) else tuple(nums)


def _leaf_arrays(leaves: list, what: str) -> list[Array]:
    out = []
    for x in leaves:
        if not isinstance(x, Array):
            try:
                x = asarray(x)
            except (KilnError, TypeError, ValueError) as e:
                raise TypeError(f"{what}: a leaf of type {type(x).__name__} is not an array") from e
        out.append(x)
    return out


def _check_differentiable(leaves: list[Array], where: str) -> None:
    for x in leaves:
        if not x.dtype.is_floating:
            raise TypeError(f"{where}: gradients need floating-point inputs, got an array of "
                            f"{x.dtype.name} {x.shape}")


def value_and_grad(fun: Callable, argnums: int | Sequence[int] = 0,
                   has_aux: bool = False) -> Callable:
    """``fun``'s value and its gradient with respect to the arguments
    ``argnums`` (trees of float arrays), in those arguments' structure.
    ``fun`` returns a scalar, or ``(scalar, aux)`` when ``has_aux``."""
    nums = _as_tuple(argnums)
    single = isinstance(argnums, int)

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any):
        for i in nums:
            if i >= len(args):
                raise TypeError(f"value_and_grad: argnums names argument {i}, "
                                f"but {len(args)} were given")
        leaves, treedef = tree.flatten(tuple(args[i] for i in nums))
        leaves = _leaf_arrays(leaves, "value_and_grad")
        _check_differentiable(leaves, "value_and_grad")
        aux_box: list = []

        def flat_fun(flat: list[Array]) -> Array:
            diff = tree.unflatten(treedef, flat)
            full = list(args)
            for k, i in enumerate(nums):
                full[i] = diff[k]
            out = fun(*full, **kwargs)
            if has_aux:
                if not (isinstance(out, tuple) and len(out) == 2):
                    raise TypeError("value_and_grad(has_aux=True): the function must return "
                                    f"(value, aux), got {type(out).__name__}")
                out, aux = out
                aux_box.append(aux)
            out = asarray(out)
            if out.shape != ():
                raise TypeError("value_and_grad: the function must return a scalar, got an "
                                f"array of shape {out.shape}")
            return out

        value, grads = _kiln._value_and_grad(flat_fun, leaves)
        g = tree.unflatten(treedef, grads)
        g = g[0] if single else g
        if has_aux:
            return (value, aux_box[-1]), g
        return value, g

    return wrapped


def grad(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """The gradient of a scalar function (see ``value_and_grad``); with
    ``has_aux``, ``(gradient, aux)``."""
    vg = value_and_grad(fun, argnums, has_aux)

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any):
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return wrapped


def vjp(fun: Callable, *primals: Any, has_aux: bool = False):
    """``(fun(*primals), vjp_fn)``, where ``vjp_fn(cotangent)`` returns the
    cotangents of the primals (a tuple, one per primal, each in its
    structure) for a cotangent of the output's structure; with ``has_aux``,
    ``fun`` returns ``(output, aux)`` and vjp returns ``(output, vjp_fn, aux)``.
    The backward pass is built when ``vjp_fn`` is called (it runs the
    forward again to record it)."""
    leaves, treedef = tree.flatten(primals)
    leaves = _leaf_arrays(leaves, "vjp")
    out = fun(*tree.unflatten(treedef, leaves))
    aux = None
    if has_aux:
        out, aux = out
    out_leaves, out_def = tree.flatten(out)

    def flat_fun(flat: list[Array]) -> list[Array]:
        o = fun(*tree.unflatten(treedef, flat))
        return _leaf_arrays(tree.leaves(o[0] if has_aux else o), "vjp")

    def vjp_fn(cotangent: Any) -> tuple:
        ct_leaves, ct_def = tree.flatten(cotangent)
        if ct_def != out_def:
            raise ValueError(f"vjp: the cotangent's structure {ct_def!r} differs from the "
                             f"output's {out_def!r}")
        _check_differentiable(leaves, "vjp")
        _, grads = _kiln._vjp(flat_fun, leaves, _leaf_arrays(ct_leaves, "vjp"))
        return tree.unflatten(treedef, grads)

    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


def _signature(leaves: list[Array]) -> tuple:
    return (_kiln.matmul_precision(),) + tuple((x.shape, x.dtype, x.device) for x in leaves)


class _Traced:
    """One compiled form of a jitted function for one input structure and
    one set of static values: the C++ Jitted (which keys its executables by
    shapes, dtypes, devices and precision) and the output structure of each
    signature it traced."""

    def __init__(self, fun: Callable, static: dict, treedef: tree.TreeDef, donate: list[int],
                 capacity: int):
        out_defs: dict = {}
        self.out_defs = out_defs
        self.donate = donate

        def traced(flat: list[Array]) -> list[Array]:
            dyn_args, kwargs = tree.unflatten(treedef, flat)
            full, it = [], iter(dyn_args)
            for i in range(len(dyn_args) + len(static)):
                full.append(static[i] if i in static else next(it))
            out = fun(*full, **kwargs)
            out_leaves, out_def = tree.flatten(out)
            out_defs[_signature(flat)] = out_def
            return _leaf_arrays(out_leaves, "jit (the function's output)")

        self.jitted = _kiln._Jitted(traced, donate, capacity)


class Jitted:
    """A jitted function: call it as the function. ``cache_stats()`` counts
    its compilations."""

    def __init__(self, fun: Callable, static_argnums: Sequence[int], donate_argnums: Sequence[int],
                 cache_capacity: int):
        self._fun = fun
        self._static = tuple(sorted(static_argnums))
        self._donate = tuple(donate_argnums)
        self._capacity = cache_capacity
        self._entries: collections.OrderedDict = collections.OrderedDict()
        self._retired = {"hits": 0, "misses": 0, "compiles": 0, "evictions": 0, "replays": 0}
        functools.update_wrapper(self, fun)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        static = {}
        n = len(args)
        for i in self._static:
            if not -n <= i < n:
                raise TypeError(f"jit: static_argnums names argument {i}, but {n} were given")
            i %= n
            try:
                hash(args[i])
            except TypeError as e:
                raise TypeError(f"jit: static argument {i} must be hashable, got "
                                f"{type(args[i]).__name__}") from e
            static[i] = args[i]
        dyn = tuple(a for i, a in enumerate(args) if i not in static)
        leaves, treedef = tree.flatten((dyn, kwargs))
        leaves = _leaf_arrays(leaves, "jit")
        key = (treedef, tuple(sorted(static.items(), key=lambda kv: kv[0])))
        entry = self._entries.get(key)
        if entry is None:
            donate, start = [], 0
            donated = {i % n for i in self._donate if -n <= i < n}
            for i, a in enumerate(args):
                if i not in static:
                    k = tree.structure(a).num_leaves
                    if i in donated:
                        donate.extend(range(start, start + k))
                    start += k
            entry = _Traced(self._fun, static, treedef, donate, self._capacity)
            self._entries[key] = entry
            if len(self._entries) > self._capacity:
                _, old = self._entries.popitem(last=False)
                for k, v in old.jitted.cache_stats().items():
                    self._retired[k] += v
                self._retired["evictions"] += 1
        else:
            self._entries.move_to_end(key)
        for i in entry.donate:
            if _kiln._exported(leaves[i]):
                raise KilnError("[jit] a donated argument's memory is viewed by numpy or DLPack; "
                                "donating it would change what the view shows (copy it first: "
                                "kiln.array(x), or drop the view)")
        outs = entry.jitted(leaves)
        defs = entry.out_defs
        out_def = next(iter(defs.values())) if len(defs) == 1 else defs[_signature(leaves)]
        return tree.unflatten(out_def, outs)

    def cache_stats(self) -> dict:
        """Counts over every compiled form: ``compiles`` (traces and
        compilations), ``hits`` (calls that reused one), ``misses``,
        ``evictions`` and ``replays``."""
        total = dict(self._retired)
        for e in self._entries.values():
            for k, v in e.jitted.cache_stats().items():
                total[k] += v
        return total

    def last_compile(self) -> dict:
        """The statistics of the most recently used form's last compilation
        (nodes, arena bytes, compile_ms)."""
        if not self._entries:
            return {}
        return next(reversed(self._entries.values())).jitted.last_compile()


def jit(fun: Callable | None = None, *, static_argnums: int | Sequence[int] = (),
        donate_argnums: int | Sequence[int] = (), cache_capacity: int = 8) -> Any:
    """``fun`` traced once per input signature into one compiled program and
    replayed (JAX's jit). Arguments are trees of arrays (numbers and numpy
    arrays become kiln arrays); ``static_argnums`` are hashable Python values
    that key the cache; ``donate_argnums``' buffers may hold the outputs
    (their arrays are then unusable, as in JAX). Usable as a decorator, with
    or without arguments."""
    if fun is None:
        return functools.partial(jit, static_argnums=static_argnums,
                                 donate_argnums=donate_argnums, cache_capacity=cache_capacity)
    return Jitted(fun, _as_tuple(static_argnums), _as_tuple(donate_argnums), cache_capacity)


def lazy() -> Any:
    """A context in which operations record instead of running (torch_xla's
    lazy tensors); reading a value, ``eval`` or ``mark_step`` runs what is
    pending, compiled and cached by the graph's structure."""
    return _kiln._LazyScope()


def mark_step(*trees: Any) -> None:
    """The lazy mode's step barrier: compiles and runs what the arrays in
    ``trees`` are pending on."""
    _kiln.mark_step([x for x in tree.leaves(trees) if isinstance(x, Array)])


def eval(*trees: Any) -> None:  # noqa: A001 - kiln's name for it, as MLX's
    """Materializes the arrays in ``trees``."""
    _kiln.eval([x for x in tree.leaves(trees) if isinstance(x, Array)])


lazy_cache_stats = _kiln.lazy_cache_stats
