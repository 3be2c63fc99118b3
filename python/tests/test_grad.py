"""grad, value_and_grad and vjp over Python functions and trees, against
central finite differences in f64."""
import collections

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F


def _check_fd(f, args, rng, argnums=0, eps=1e-6, tol=1e-7):
    """The gradient's projection on random directions against central
    differences of f (a scalar function of f64 arrays)."""
    g = kiln.grad(f, argnums)(*args)
    nums = (argnums,) if isinstance(argnums, int) else argnums
    gs = (g,) if isinstance(argnums, int) else g
    for k, i in enumerate(nums):
        x = np.asarray(args[i])
        d = rng.standard_normal(x.shape)
        plus, minus = list(args), list(args)
        plus[i] = kiln.asarray(x + eps * d)
        minus[i] = kiln.asarray(x - eps * d)
        fd = (f(*plus).item() - f(*minus).item()) / (2 * eps)
        an = float(np.sum(np.asarray(gs[k]) * d))
        assert abs(fd - an) <= tol * (1 + abs(fd)), (i, fd, an)


def _x(rng, *shape, positive=False):
    x = rng.standard_normal(shape)
    return kiln.asarray(np.abs(x) + 0.2 if positive else x)


UNARY = ["neg", "exp", "log", "sqrt", "rsqrt", "tanh", "erf", "gelu", "gelu_tanh", "relu", "abs",
         "square", "sin", "cos", "log1p", "expm1"]


@pytest.mark.parametrize("axis,reverse", [(0, False), (1, True), (-1, False)])
def test_cumsum_gradients(rng, axis, reverse):
    w = _x(rng, 3, 4)
    _check_fd(lambda x: kiln.sum(kiln.cumsum(x, axis, reverse) * w), [_x(rng, 3, 4)], rng)


@pytest.mark.parametrize("axis,descending", [(0, False), (-1, True)])
def test_sort_and_top_k_gradients(rng, axis, descending):
    w, v = _x(rng, 3, 5), _x(rng, 3, 2)
    _check_fd(lambda x: kiln.sum(kiln.sort(x, axis, descending) * w), [_x(rng, 3, 5)], rng)
    _check_fd(lambda x: kiln.sum(kiln.top_k(x, 2)[0] * v), [_x(rng, 3, 5)], rng)


@pytest.mark.parametrize("name", UNARY)
def test_unary_gradients(rng, name):
    op = getattr(kiln, name)
    positive = name in ("log", "sqrt", "rsqrt", "log1p")
    w = _x(rng, 3, 4)
    _check_fd(lambda x: kiln.sum(op(x) * w), [_x(rng, 3, 4, positive=positive)], rng)


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "divide", "maximum", "minimum"])
def test_binary_gradients_with_broadcasting(rng, name):
    op = getattr(kiln, name)
    w = _x(rng, 2, 3, 4)
    b = _x(rng, 3, 1, positive=(name == "divide"))
    _check_fd(lambda x, y: kiln.sum(op(x, y) * w), [_x(rng, 2, 3, 4), b], rng, argnums=(0, 1))


def test_reduction_matmul_layout_gradients(rng):
    w = _x(rng, 4, 6)
    _check_fd(lambda x: kiln.sum(kiln.mean(x, axis=1) * w[:, 0]), [_x(rng, 4, 5)], rng)
    _check_fd(lambda x: kiln.sum(kiln.max(x, axis=0) * w[0, :5]), [_x(rng, 4, 5)], rng)
    _check_fd(lambda a, b: kiln.sum((a @ b) * w), [_x(rng, 4, 3), _x(rng, 3, 6)], rng,
              argnums=(0, 1))
    _check_fd(lambda x: kiln.sum(x.T.reshape(4, 6) * w), [_x(rng, 6, 4)], rng)
    _check_fd(lambda x: kiln.sum(x[1:, ::2] * w[:3, :3]), [_x(rng, 4, 6)], rng)
    _check_fd(lambda x: kiln.sum(kiln.concatenate([x, x * 2.0], 1) * w[:, :4]), [_x(rng, 4, 2)],
              rng)
    idx = kiln.asarray(np.array([2, 0, 2], np.int32))
    _check_fd(lambda x: kiln.sum(kiln.take(x, idx, 0) * w[:3, :2]), [_x(rng, 3, 2)], rng)
    _check_fd(lambda x: kiln.sum(kiln.broadcast_to(x, [4, 6]) * w), [_x(rng, 1, 6)], rng)


def test_nn_gradients(rng):
    w = _x(rng, 4, 7)
    _check_fd(lambda x: kiln.sum(F.softmax(x) * w), [_x(rng, 4, 7)], rng)
    _check_fd(lambda x: kiln.sum(F.log_softmax(x) * w), [_x(rng, 4, 7)], rng)
    _check_fd(lambda x, g, b: kiln.sum(F.layer_norm(x, g, b, 1e-5) * w),
              [_x(rng, 4, 7), _x(rng, 7), _x(rng, 7)], rng, argnums=(0, 1, 2))
    labels = np.array([1, 6, 0, 3], np.int32)
    _check_fd(lambda x: F.cross_entropy(x, labels), [_x(rng, 4, 7)], rng)


def test_attention_gradient(rng):
    qkv = kiln.asarray(rng.standard_normal((1, 4, 3, 2, 3)).astype(np.float32))
    w = kiln.asarray(rng.standard_normal((1, 4, 2, 3)).astype(np.float32))
    f = lambda x: kiln.sum(F.attention(x, 0.5) * w)  # noqa: E731
    g = np.asarray(kiln.grad(f)(qkv))
    x = np.asarray(qkv).astype(np.float64)
    d = rng.standard_normal(x.shape)
    eps = 1e-3
    fd = (f(kiln.asarray((x + eps * d).astype(np.float32))).item()
          - f(kiln.asarray((x - eps * d).astype(np.float32))).item()) / (2 * eps)
    assert abs(fd - float(np.sum(g * d))) < 2e-3 * (1 + abs(fd))


Params = collections.namedtuple("Params", ["w", "b"])


def test_trees_in_and_out(rng):
    params = {"layer": Params(w=_x(rng, 3, 2), b=_x(rng, 2)), "scale": [_x(rng), None]}
    x = _x(rng, 5, 3)

    def loss(p, x):
        h = x @ p["layer"].w + p["layer"].b
        return kiln.mean(kiln.square(h)) * p["scale"][0]

    value, g = kiln.value_and_grad(loss)(params, x)
    assert isinstance(g, dict) and isinstance(g["layer"], Params) and g["scale"][1] is None
    assert g["layer"].w.shape == (3, 2) and g["layer"].b.shape == (2,) and g["scale"][0].shape == ()
    assert value.item() == pytest.approx(loss(params, x).item())
    # the gradient of the scale is the unscaled loss
    s = params["scale"][0].item()
    assert g["scale"][0].item() == pytest.approx(value.item() / s, rel=1e-10)
    _check_fd(lambda w: loss({"layer": Params(w, params["layer"].b), "scale": params["scale"]}, x),
              [params["layer"].w], rng)


def test_argnums_and_has_aux(rng):
    a, b = _x(rng, 3), _x(rng, 3)

    def f(a, b):
        return kiln.sum(a * b), {"prod": a * b}

    (v, aux), (ga, gb) = kiln.value_and_grad(f, argnums=(0, 1), has_aux=True)(a, b)
    np.testing.assert_allclose(np.asarray(ga), np.asarray(b))
    np.testing.assert_allclose(np.asarray(gb), np.asarray(a))
    np.testing.assert_allclose(np.asarray(aux["prod"]), np.asarray(a) * np.asarray(b))
    g, aux2 = kiln.grad(f, argnums=1, has_aux=True)(a, b)
    np.testing.assert_allclose(np.asarray(g), np.asarray(a))


def test_grad_errors():
    with pytest.raises(TypeError, match="scalar"):
        kiln.grad(lambda x: x * 2.0)(kiln.ones((3,)))
    with pytest.raises(TypeError, match="floating-point"):
        kiln.grad(lambda x: kiln.sum(x))(kiln.asarray([1, 2]))

    class Boom(Exception):
        pass

    def f(x):
        raise Boom("from inside")

    with pytest.raises(Boom, match="from inside"):  # a Python exception reaches the caller as it is
        kiln.grad(f)(kiln.ones((2,)))


def test_vjp(rng):
    x, y = _x(rng, 2, 3), _x(rng, 3)
    out, vjp_fn = kiln.vjp(lambda x, y: {"s": x * y, "t": kiln.sum(x)}, x, y)
    ct = {"s": _x(rng, 2, 3), "t": kiln.asarray(np.float64(2.0))}
    gx, gy = vjp_fn(ct)
    cs = np.asarray(ct["s"])
    np.testing.assert_allclose(np.asarray(gx), cs * np.asarray(y) + 2.0)
    np.testing.assert_allclose(np.asarray(gy), (cs * np.asarray(x)).sum(0))
    np.testing.assert_allclose(np.asarray(out["s"]), np.asarray(x) * np.asarray(y))
    with pytest.raises(ValueError, match="structure"):
        vjp_fn([ct["s"]])
