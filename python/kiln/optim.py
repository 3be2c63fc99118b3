"""Optimizers as pure functions of (grads, state, params), as optax's, over
kiln's C++ update rules: SGD (momentum, dampening, Nesterov, weight decay)
and AdamW, learning-rate schedules (constant, cosine, linear, with warm-up)
and global-norm clipping. The state is a tree of arrays (the step count
among them), so a whole training step jits::

    opt = kiln.optim.AdamW(lr=1e-3, schedule=kiln.optim.Schedule("cosine", 10, 1000))
    state = opt.init(params)

    @kiln.jit(donate_argnums=(0, 1))
    def step(params, state, x, y):
        loss, grads = kiln.value_and_grad(loss_fn)(params, x, y)
        params, state = opt.update(grads, state, params)
        return params, state, loss
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from . import _kiln, tree
from ._array import Array, asarray, float32, full, int32, zeros
from ._kiln import KilnError

__all__ = ["State", "Schedule", "Optimizer", "SGD", "AdamW", "clip_by_global_norm",
           "no_weight_decay", "parameter_names"]

no_weight_decay = _kiln.no_weight_decay


class State(NamedTuple):
    """An optimizer's state: the updates made so far (an int32 scalar) and
    its buffers by name ("momentum/<param>", "exp_avg/<param>", ...)."""
    step: Array
    buffers: dict


class Schedule:
    """The learning rate's factor at update k: ``constant`` (1 after a linear
    warm-up of ``warmup`` updates), ``cosine`` (warm-up, then a half cosine
    to 0 at ``total``) or ``linear`` (transformers'
    get_linear_schedule_with_warmup)."""

    def __init__(self, kind: str = "constant", warmup: int = 0, total: int = 0):
        self.kind, self.warmup, self.total = kind, int(warmup), int(total)
        n = (self.total if kind != "constant" else self.warmup) + 1
        self.factors = _kiln._schedule_factors(kind, self.warmup, self.total, n)

    def __call__(self, k: int) -> float:
        """The factor of update k (0-based), on the host."""
        return self.factors[min(int(k), len(self.factors) - 1)]

    def on_graph(self, step: Array) -> Array | None:
        """The factor of update ``step`` as an f32 scalar computed from the
        step array (a table lookup), so that a jitted step follows the
        schedule; None when it is 1 throughout."""
        if len(self.factors) == 1 and self.factors[0] == 1.0:
            return None
        table = asarray(self.factors, dtype=float32, device=step.device)
        k = _kiln.minimum(step, full((), len(self.factors) - 1, int32, step.device))
        return _kiln.take(table, k, 0)


def _param_name(path: tuple) -> str:
    return ".".join(str(p) for p in path) if path else "param"


def parameter_names(params: Any) -> list[str]:
    """The names the optimizers give the leaves of a parameter tree: dict
    keys, field names and indices joined by dots (a flat dict of
    HuggingFace names keeps its names)."""
    return [_param_name(p) for p in tree.flatten_with_path(params)[0]]


class Optimizer:
    """An optimizer over parameter trees (see SGD and AdamW)."""

    def __init__(self, rule: Any, lr: float, schedule: Schedule | None):
        self._rule = rule
        self.lr = float(lr)
        self.schedule = schedule or Schedule()

    @property
    def name(self) -> str:
        return self._rule.name

    def init(self, params: Any) -> State:
        paths, leaves, _ = tree.flatten_with_path(params)
        if not leaves:
            raise KilnError("[optim] the parameter tree has no arrays")
        named = {_param_name(p): asarray(x) for p, x in zip(paths, leaves)}
        return State(step=zeros((), int32, leaves[0].device), buffers=self._rule.init(named))

    def _scalars(self, step: Array) -> list[Array]:
        raise NotImplementedError

    def update(self, grads: Any, state: State, params: Any) -> tuple[Any, State]:
        """The parameters after one update, and the next state."""
        paths, p_leaves, pdef = tree.flatten_with_path(params)
        g_leaves, gdef = tree.flatten(grads)
        if gdef != pdef:
            raise ValueError(f"[optim] the gradients' structure {gdef!r} differs from the "
                             f"parameters' {pdef!r}")
        names = [_param_name(p) for p in paths]
        new_p, new_b = self._rule.apply(dict(zip(names, g_leaves)), state.buffers,
                                        dict(zip(names, p_leaves)), self._scalars(state.step))
        return tree.unflatten(pdef, [new_p[n] for n in names]), State(state.step + 1, new_b)

    def _lr(self, step: Array) -> Array:
        f = self.schedule.on_graph(step)
        lr = full((), self.lr, float32, step.device)
        return lr if f is None else lr * f


class SGD(Optimizer):
    """torch.optim.SGD: lr, momentum, dampening, weight_decay, nesterov;
    exempt_from_decay leaves biases, LayerNorm weights, position embeddings
    and the [CLS] token undecayed (no_weight_decay); ``lr_scale``:
    {parameter name: learning-rate multiplier} (layer-wise decay:
    ``model.layer_decay_scales(0.65)``), as torch param groups' lr_scale."""

    def __init__(self, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False,
                 exempt_from_decay: bool = False, schedule: Schedule | None = None,
                 lr_scale: dict | None = None):
        super().__init__(_kiln._SGD(float(lr), float(momentum), float(dampening),
                                    float(weight_decay), bool(nesterov), bool(exempt_from_decay),
                                    dict(lr_scale or {})),
                         lr, schedule)
        self.momentum, self.dampening = float(momentum), float(dampening)

    def _scalars(self, step: Array) -> list[Array]:
        # lr, the old momentum buffer's weight and the gradient's (0 and 1 on
        # the first update, so that the zero buffer becomes the gradient).
        first = step == 0
        d = step.device
        return [self._lr(step),
                _kiln.where(first, full((), 0.0, float32, d), full((), self.momentum, float32, d)),
                _kiln.where(first, full((), 1.0, float32, d),
                            full((), 1.0 - self.dampening, float32, d))]


class AdamW(Optimizer):
    """torch.optim.AdamW: lr, betas, eps, weight_decay (decoupled);
    exempt_from_decay and lr_scale as SGD's (the decoupled decay follows each
    parameter's scaled lr)."""

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, exempt_from_decay: bool = False,
                 schedule: Schedule | None = None, lr_scale: dict | None = None):
        super().__init__(_kiln._AdamW(float(lr), float(betas[0]), float(betas[1]), float(eps),
                                      float(weight_decay), bool(exempt_from_decay),
                                      dict(lr_scale or {})), lr, schedule)
        self.betas, self.weight_decay = (float(betas[0]), float(betas[1])), float(weight_decay)

    def _scalars(self, step: Array) -> list[Array]:
        # 1 - lr·wd, lr / (1 - β1ᵗ) and √(1 - β2ᵗ) for update t = step + 1,
        # with βᵗ = exp(t·log β).
        t = (step + 1).astype(float32)

        def power(beta: float) -> Array:
            return t * 0.0 if beta == 0 else _kiln.exp(t * math.log(beta))

        lr = self._lr(step)
        return [1.0 - lr * self.weight_decay, lr / (1.0 - power(self.betas[0])),
                _kiln.sqrt(1.0 - power(self.betas[1]))]


def clip_by_global_norm(grads: Any, max_norm: float) -> tuple[Any, Array]:
    """The gradients scaled so that their global L2 norm is at most max_norm
    (``torch.nn.utils.clip_grad_norm_``), and the norm before clipping."""
    paths, leaves, d = tree.flatten_with_path(grads)
    names = [_param_name(p) for p in paths]
    clipped, norm = _kiln._clip_by_global_norm(dict(zip(names, leaves)), float(max_norm))
    return tree.unflatten(d, [clipped[n] for n in names]), norm
