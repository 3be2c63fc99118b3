"""Trees of arrays: nested dicts, lists, tuples, namedtuples and registered
classes, flattened to a list of leaves and a structure (as ``jax.tree_util``).

``None`` is an empty subtree; dict keys are visited in sorted order; any other
object is a leaf.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable

__all__ = ["TreeDef", "flatten", "flatten_with_path", "unflatten", "map", "leaves", "structure",
           "register"]

_registry: dict[type, tuple[Callable, Callable]] = {}


def register(cls: type, flatten_fn: Callable, unflatten_fn: Callable) -> None:
    """Makes instances of ``cls`` tree nodes: ``flatten_fn(obj)`` returns
    ``(children, aux)`` (aux hashable: it is part of the structure) and
    ``unflatten_fn(aux, children)`` rebuilds the object."""
    _registry[cls] = (flatten_fn, unflatten_fn)


class TreeDef:
    """The structure of a tree: hashable and comparable, so that it can key a
    cache (``kiln.jit`` keys its compiled functions by it)."""

    __slots__ = ("kind", "aux", "children", "num_leaves", "_hash")

    def __init__(self, kind: Any, aux: Hashable, children: tuple):
        self.kind = kind  # None: a leaf; else the node's type
        self.aux = aux
        self.children = children
        self.num_leaves = 1 if kind is None else sum(c.num_leaves for c in children)
        self._hash = hash((kind, aux, children))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TreeDef) and self._hash == other._hash and self.kind is other.kind
                and self.aux == other.aux and self.children == other.children)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        if self.kind is None:
            return "*"
        inner = ", ".join(map(repr, self.children))
        if self.kind is dict:
            return "{" + ", ".join(f"{k!r}: {c!r}" for k, c in zip(self.aux, self.children)) + "}"
        if self.kind is list:
            return f"[{inner}]"
        if self.kind is tuple:
            return f"({inner}{',' if len(self.children) == 1 else ''})"
        if self.kind is type(None):
            return "None"
        return f"{self.kind.__name__}({inner})"


_LEAF = TreeDef(None, None, ())


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _flatten(x: Any, out: list) -> TreeDef:
    t = type(x)
    if t is dict:
        keys = sorted(x)
        return TreeDef(dict, tuple(keys), tuple(_flatten(x[k], out) for k in keys))
    if t is list or t is tuple:
        return TreeDef(t, None, tuple(_flatten(c, out) for c in x))
    if x is None:
        return TreeDef(type(None), None, ())
    if _is_namedtuple(x):
        return TreeDef(t, None, tuple(_flatten(c, out) for c in x))
    reg = _registry.get(t)
    if reg is not None:
        children, aux = reg[0](x)
        return TreeDef(t, aux, tuple(_flatten(c, out) for c in children))
    out.append(x)
    return _LEAF


def flatten(tree: Any) -> tuple[list, TreeDef]:
    """The leaves of ``tree`` in order, and its structure."""
    out: list = []
    return out, _flatten(tree, out)


def _build(d: TreeDef, it) -> Any:
    if d.kind is None:
        return next(it)
    children = [_build(c, it) for c in d.children]
    if d.kind is dict:
        return dict(zip(d.aux, children))
    if d.kind is list:
        return children
    if d.kind is tuple:
        return tuple(children)
    if d.kind is type(None):
        return None
    if issubclass(d.kind, tuple) and hasattr(d.kind, "_fields"):
        return d.kind(*children)
    return _registry[d.kind][1](d.aux, children)


def unflatten(treedef: TreeDef, leaves: list) -> Any:
    """The tree of structure ``treedef`` holding ``leaves``."""
    leaves = list(leaves)
    if len(leaves) != treedef.num_leaves:
        raise ValueError(f"the structure {treedef!r} holds {treedef.num_leaves} leaves, "
                         f"got {len(leaves)}")
    return _build(treedef, iter(leaves))


def leaves(tree: Any) -> list:
    return flatten(tree)[0]


def structure(tree: Any) -> TreeDef:
    return flatten(tree)[1]


def map(f: Callable, tree: Any, *rest: Any) -> Any:
    """``f`` applied leaf by leaf; ``rest`` are trees of the same structure."""
    xs, d = flatten(tree)
    others = []
    for r in rest:
        ys, e = flatten(r)
        if e != d:
            raise ValueError(f"tree structures differ: {d!r} and {e!r}")
        others.append(ys)
    return unflatten(d, [f(*args) for args in zip(xs, *others)])



def _paths(d: TreeDef, prefix: tuple, out: list) -> None:
    if d.kind is None:
        out.append(prefix)
        return
    if d.kind is dict:
        keys = d.aux
    elif isinstance(d.kind, type) and issubclass(d.kind, tuple) and hasattr(d.kind, "_fields"):
        keys = d.kind._fields
    else:
        keys = range(len(d.children))
    for k, c in zip(keys, d.children):
        _paths(c, prefix + (k,), out)


def flatten_with_path(tree: Any) -> tuple[list, list, TreeDef]:
    """The paths of the leaves (tuples of dict keys, field names and
    indices), the leaves, and the structure."""
    xs, d = flatten(tree)
    paths: list = []
    _paths(d, (), paths)
    return paths, xs, d
