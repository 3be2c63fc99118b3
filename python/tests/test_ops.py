"""Every op of kiln against numpy, across dtypes and broadcasting."""
import math

import ml_dtypes
import numpy as np
import pytest

import kiln
import kiln.nn.functional as F

_erf = np.vectorize(math.erf)


def _gelu(x):
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


UNARY = {
    "neg": (kiln.neg, np.negative, "any"),
    "exp": (kiln.exp, np.exp, "any"),
    "log": (kiln.log, np.log, "positive"),
    "sqrt": (kiln.sqrt, np.sqrt, "positive"),
    "rsqrt": (kiln.rsqrt, lambda x: 1 / np.sqrt(x), "positive"),
    "tanh": (kiln.tanh, np.tanh, "any"),
    "erf": (kiln.erf, _erf, "any"),
    "gelu": (kiln.gelu, _gelu, "any"),
    "gelu_tanh": (kiln.gelu_tanh, _gelu_tanh, "any"),
    "relu": (kiln.relu, lambda x: np.maximum(x, 0), "any"),
    "abs": (kiln.abs, np.abs, "any"),
    "square": (kiln.square, np.square, "any"),
    "sin": (kiln.sin, np.sin, "any"),
    "cos": (kiln.cos, np.cos, "any"),
    "log1p": (kiln.log1p, np.log1p, "positive"),
    "expm1": (kiln.expm1, np.expm1, "any"),
    "sign": (kiln.sign, np.sign, "any"),
    "floor": (kiln.floor, np.floor, "any"),
    "round": (kiln.round, np.round, "any"),
    "sigmoid": (F.sigmoid, lambda x: 1 / (1 + np.exp(-x)), "any"),
}
TOL = {np.float32: 2e-6, np.float64: 1e-12, ml_dtypes.bfloat16: 1e-2}


def _input(rng, shape, dt, domain="any"):
    x = rng.standard_normal(shape)
    if domain == "positive":
        x = np.abs(x) + 0.1
    return x.astype(dt)


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dt", [np.float32, np.float64, ml_dtypes.bfloat16])
def test_unary(rng, name, dt):
    op, ref, domain = UNARY[name]
    x = _input(rng, (3, 5), dt, domain)
    got = np.asarray(op(kiln.asarray(x))).astype(np.float64)
    want = ref(x.astype(np.float64))
    tol = TOL[dt]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * (1 + np.abs(want).max()))


BINARY = {
    "add": (kiln.add, np.add),
    "subtract": (kiln.subtract, np.subtract),
    "multiply": (kiln.multiply, np.multiply),
    "divide": (kiln.divide, np.divide),
    "maximum": (kiln.maximum, np.maximum),
    "minimum": (kiln.minimum, np.minimum),
    "equal": (kiln.equal, np.equal),
    "not_equal": (kiln.not_equal, np.not_equal),
    "less": (kiln.less, np.less),
    "less_equal": (kiln.less_equal, np.less_equal),
    "greater": (kiln.greater, np.greater),
    "greater_equal": (kiln.greater_equal, np.greater_equal),
}
SHAPES = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (3,)), ((5, 1), (1, 6))]


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.int32])
def test_cumsum(rng, dt):
    x = (5 * rng.standard_normal((3, 4, 5))).astype(dt)
    for axis in (0, 1, -1):
        got = np.asarray(kiln.cumsum(kiln.asarray(x), axis))
        np.testing.assert_allclose(got, np.cumsum(x, axis), rtol=1e-5, atol=1e-5)
        rev = np.asarray(kiln.cumsum(kiln.asarray(x), axis, reverse=True))
        want = np.flip(np.cumsum(np.flip(x, axis), axis), axis)
        np.testing.assert_allclose(rev, want, rtol=1e-5, atol=1e-5)
    assert kiln.cumsum(kiln.asarray(x), 1).dtype == kiln.asarray(x).dtype


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.int32, np.int64])
def test_sort_argsort_top_k(rng, dt):
    x = (4 * rng.standard_normal((4, 6, 5))).astype(dt)  # ties among the integers
    a = kiln.asarray(x)
    for axis in (0, 1, -1):
        idx = kiln.argsort(a, axis)
        assert idx.dtype == kiln.int32
        np.testing.assert_array_equal(np.asarray(idx), np.argsort(x, axis, kind="stable"))
        np.testing.assert_array_equal(np.asarray(kiln.sort(a, axis)), np.sort(x, axis))
        down = np.asarray(kiln.argsort(a, axis, descending=True))
        # Largest first, equal elements in their order: a stable sort of -x.
        np.testing.assert_array_equal(down, np.argsort(-x.astype(np.float64), axis, kind="stable"))
        np.testing.assert_array_equal(np.asarray(kiln.take_along_axis(a, idx, axis)),
                                      np.take_along_axis(x, np.argsort(x, axis, kind="stable"), axis))
    values, indices = kiln.top_k(a, 3)
    want = np.argsort(-x.astype(np.float64), -1, kind="stable")[..., :3]
    np.testing.assert_array_equal(np.asarray(indices), want)
    np.testing.assert_array_equal(np.asarray(values), np.take_along_axis(x, want, -1))


def test_sort_nan_last_and_errors():
    x = np.array([3.0, np.nan, -1.0, 2.0], np.float32)
    np.testing.assert_array_equal(np.asarray(kiln.argsort(kiln.asarray(x))), np.argsort(x))
    np.testing.assert_array_equal(np.asarray(kiln.argsort(kiln.asarray(x), descending=True)),
                                  [1, 0, 3, 2])
    with pytest.raises(kiln.KilnError, match=r"\[top_k\] k must be in"):
        kiln.top_k(kiln.asarray(x), 5)
    with pytest.raises(kiln.KilnError, match=r"\[take_along_axis\] indices of shape"):
        kiln.take_along_axis(kiln.asarray(x), kiln.asarray(np.zeros((2, 2), np.int32)), 0)
    with pytest.raises(kiln.KilnError, match=r"\[argsort\] needs a float or integer array"):
        kiln.argsort(kiln.asarray(np.array([True, False])))


def test_logical_ops(rng):
    a = rng.integers(-1, 2, (3, 4)).astype(np.float32)
    b = rng.standard_normal(4) > 0
    ka, kb = kiln.asarray(a), kiln.asarray(b)
    for name in ("logical_and", "logical_or", "logical_xor"):
        got = getattr(kiln, name)(ka, kb)
        assert got.dtype == kiln.bool_
        np.testing.assert_array_equal(np.asarray(got), getattr(np, name)(a, b))
    np.testing.assert_array_equal(np.asarray(kiln.logical_not(ka)), np.logical_not(a))


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_power_and_clip(rng, dt):
    a = (np.abs(rng.standard_normal((3, 4))) + 0.1).astype(dt)
    b = rng.standard_normal((4,)).astype(dt)
    got = np.asarray(kiln.power(kiln.asarray(a), kiln.asarray(b)))
    np.testing.assert_allclose(got, np.power(a, b), rtol=TOL[dt])
    x = (3 * rng.standard_normal((4, 5))).astype(dt)
    np.testing.assert_array_equal(np.asarray(kiln.clip(kiln.asarray(x), -1.0, 2.0)),
                                  np.clip(x, -1.0, 2.0))
    with pytest.raises(kiln.KilnError, match="above upper bound"):
        kiln.clip(kiln.asarray(x), 2.0, 1.0)


# Integer division is not one of kiln's ops (divide takes floats).
CASES = [(n, dt) for n in sorted(BINARY) for dt in (np.float32, np.float64, np.int32, np.int64)
         if not (n == "divide" and np.dtype(dt).kind == "i")]


@pytest.mark.parametrize("name,dt", CASES)
@pytest.mark.parametrize("shapes", SHAPES)
def test_binary(rng, name, dt, shapes):
    op, ref = BINARY[name]
    x = (rng.standard_normal(shapes[0]) * 4).astype(dt)
    y = (rng.standard_normal(shapes[1]) * 4).astype(dt)
    if name == "divide":
        y = np.where(np.abs(y) < 0.5, 1.5, y).astype(dt)
    if name in ("equal", "not_equal", "less_equal", "greater_equal"):
        y = np.broadcast_to(y, np.broadcast_shapes(x.shape, y.shape)).copy()
        y.flat[::2] = np.broadcast_to(x, y.shape).flat[::2]  # some ties
    got = op(kiln.asarray(x), kiln.asarray(y))
    want = ref(x, y)
    assert got.shape == want.shape
    assert np.asarray(got).dtype == want.dtype
    np.testing.assert_allclose(np.asarray(got), want, rtol=TOL.get(dt, 0))


def test_python_scalars_take_the_array_dtype():
    a = kiln.asarray(np.float64([1, 2, 3]))
    assert (a + 1).dtype == kiln.float64
    np.testing.assert_array_equal(np.asarray(2.0 * a - 1), [1, 3, 5])
    np.testing.assert_array_equal(np.asarray(1 - a), [0, -1, -2])
    np.testing.assert_array_equal(np.asarray(6 / a), [6, 3, 2])
    i = kiln.asarray(np.int32([1, 2]))
    assert (i + 1).dtype == kiln.int32
    assert (i * 1.5).dtype == kiln.float32
    np.testing.assert_array_equal(np.asarray(i * 1.5), [1.5, 3])
    np.testing.assert_array_equal(np.asarray(-i), [-1, -2])
    np.testing.assert_array_equal(np.asarray(i > 1), [False, True])
    n = np.float64([10, 20, 30])
    np.testing.assert_array_equal(np.asarray(a + n), [11, 22, 33])  # numpy operand


def test_mixed_dtypes_promote():
    f = kiln.asarray(np.float32([1.5]))
    d = kiln.asarray(np.float64([2]))
    i = kiln.asarray(np.int32([3]))
    assert (f + d).dtype == kiln.float64
    assert (f * i).dtype == kiln.float32
    assert kiln.promote_types(kiln.int32, kiln.int64) == kiln.int64
    assert kiln.promote_types(kiln.bfloat16, kiln.float32) == kiln.float32


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions(rng, dt, axis, keepdims):
    x = rng.standard_normal((3, 4, 5)).astype(dt)
    a = kiln.asarray(x)
    for op, ref in ((kiln.sum, np.sum), (kiln.mean, np.mean), (kiln.max, np.max)):
        got = np.asarray(op(a, axis=axis, keepdims=keepdims))
        np.testing.assert_allclose(got, ref(x, axis=axis, keepdims=keepdims), rtol=TOL[dt] * 10,
                                   atol=TOL[dt] * 10)
    if isinstance(axis, int):
        np.testing.assert_array_equal(np.asarray(kiln.argmax(a, axis, keepdims)),
                                      np.argmax(x, axis=axis, keepdims=keepdims))


def test_integer_reductions():
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    np.testing.assert_array_equal(np.asarray(kiln.sum(kiln.asarray(x), axis=0)), x.sum(axis=0))
    np.testing.assert_array_equal(np.asarray(kiln.max(kiln.asarray(x), axis=1)), x.max(axis=1))


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("shapes", [((4, 3), (3, 5)), ((2, 4, 3), (2, 3, 5)), ((2, 4, 3), (3, 5)),
                                    ((4, 3), (2, 3, 5))])
def test_matmul(rng, dt, shapes):
    x = rng.standard_normal(shapes[0]).astype(dt)
    y = rng.standard_normal(shapes[1]).astype(dt)
    want = x @ y
    tol = 1e-5 if dt == np.float32 else 1e-12
    np.testing.assert_allclose(np.asarray(kiln.asarray(x) @ kiln.asarray(y)), want, rtol=tol,
                               atol=tol)
    xt = np.ascontiguousarray(np.swapaxes(x, -1, -2))
    yt = np.ascontiguousarray(np.swapaxes(y, -1, -2))
    got = kiln.matmul(kiln.asarray(xt), kiln.asarray(yt), transpose_a=True, transpose_b=True)
    np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)
    x_bf = kiln.asarray(x).astype("bf16")
    y_bf = kiln.asarray(y).astype("bf16")
    got = kiln.matmul(x_bf, y_bf, out_dtype="float32")
    assert got.dtype == kiln.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=0.05, atol=0.05)


def test_layout(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    a = kiln.asarray(x)
    np.testing.assert_array_equal(np.asarray(kiln.reshape(a, [4, 6])), x.reshape(4, 6))
    np.testing.assert_array_equal(np.asarray(kiln.transpose(a, (2, 0, 1))), x.transpose(2, 0, 1))
    np.testing.assert_array_equal(np.asarray(kiln.transpose(a)), x.T)
    np.testing.assert_array_equal(np.asarray(kiln.swapaxes(a, 0, 2)), np.swapaxes(x, 0, 2))
    np.testing.assert_array_equal(np.asarray(kiln.broadcast_to(a[:, :1], [2, 3, 4])),
                                  np.broadcast_to(x[:, :1], (2, 3, 4)))
    np.testing.assert_array_equal(np.asarray(kiln.concatenate([a, a * 2.0], axis=1)),
                                  np.concatenate([x, x * 2], axis=1))
    idx = np.array([[3, 0], [1, 1]], dtype=np.int32)
    np.testing.assert_array_equal(np.asarray(kiln.take(a, kiln.asarray(idx), 2)),
                                  np.take(x, idx, axis=2))
    np.testing.assert_array_equal(np.asarray(F.one_hot([2, 0], 3)), np.eye(3, dtype=np.float32)[[2, 0]])
    c = x > 0
    np.testing.assert_array_equal(np.asarray(kiln.where(kiln.asarray(c), a, 0.0)), np.where(c, x, 0))
    np.testing.assert_array_equal(np.asarray(kiln.astype(a, "int32")), x.astype(np.int32))
    np.testing.assert_array_equal(np.asarray(kiln.slice(a, [0, 1], [2, 3], [1, 2])), x[0:2, 1:3:2])



def test_dynamic_slices_as_lax_takes_them(rng):
    x = rng.standard_normal((4, 5)).astype(np.float32)
    a = kiln.asarray(x)
    starts = kiln.asarray(np.array([3, -2], np.int32))  # clamped to (2, 0): the window fits
    np.testing.assert_array_equal(np.asarray(kiln.dynamic_slice(a, starts, [2, 2])), x[2:4, 0:2])
    u = rng.standard_normal((2, 2)).astype(np.float32)
    want = x.copy()
    want[2:4, 0:2] = u
    np.testing.assert_array_equal(np.asarray(kiln.dynamic_update_slice(a, kiln.asarray(u), starts)),
                                  want)
    # One compile for every position; the gradient flows to x and to the update.
    def loss(x, u, s):
        y = kiln.dynamic_update_slice(x, u, s)
        return kiln.sum(y * y)

    step = kiln.jit(kiln.grad(loss, argnums=(0, 1)))
    for t in range(4):
        gx, gu = step(a, kiln.asarray(u), kiln.asarray(np.array([t, 1], np.int32)))
        mask = np.ones_like(x)
        r = min(t, 2)
        mask[r:r + 2, 1:3] = 0
        np.testing.assert_allclose(np.asarray(gx), 2 * x * mask, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(gu), 2 * u, rtol=1e-6)
    assert step.cache_stats()["compiles"] == 1
    with pytest.raises(kiln.KilnError, match="expected i32 or i64"):
        kiln.dynamic_slice(a, kiln.zeros((2,)), [2, 2])

def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_nn(rng, dt):
    tol = 1e-5 if dt == np.float32 else 1e-12
    x = rng.standard_normal((4, 7)).astype(dt)
    a = kiln.asarray(x)
    np.testing.assert_allclose(np.asarray(F.softmax(a)), _softmax(x), rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(F.softmax(a, axis=0)), _softmax(x, 0), rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(F.log_softmax(a)), np.log(_softmax(x)), rtol=tol,
                               atol=tol)
    w = rng.standard_normal(7).astype(dt)
    b = rng.standard_normal(7).astype(dt)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    ln = (x - mu) / np.sqrt(var + 1e-6) * w + b
    np.testing.assert_allclose(np.asarray(F.layer_norm(a, kiln.asarray(w), kiln.asarray(b), 1e-6)),
                               ln, rtol=tol * 10, atol=tol * 10)
    labels = np.array([1, 6, 0, 3], dtype=np.int32)
    ce = -np.log(_softmax(x))[np.arange(4), labels]
    np.testing.assert_allclose(np.asarray(F.softmax_cross_entropy(a, labels)), ce, rtol=tol,
                               atol=tol)
    np.testing.assert_allclose(np.asarray(F.cross_entropy(a, labels)), ce.mean(), rtol=tol,
                               atol=tol)
    np.testing.assert_allclose(np.asarray(F.cross_entropy(a, labels, "sum")), ce.sum(), rtol=tol,
                               atol=tol)
    wl = rng.standard_normal((3, 7)).astype(dt)
    np.testing.assert_allclose(np.asarray(F.linear(a, kiln.asarray(wl), kiln.asarray(b[:3]))),
                               x @ wl.T + b[:3], rtol=tol, atol=tol)


def test_attention(rng):
    B, T, H, D = 2, 5, 3, 4
    qkv = rng.standard_normal((B, T, 3, H, D)).astype(np.float32)
    scale = D**-0.5
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # [B, H, T, D]
    p = _softmax(scale * q @ k.transpose(0, 1, 3, 2))
    want = (p @ v).transpose(0, 2, 1, 3)  # [B, T, H, D]
    np.testing.assert_allclose(np.asarray(F.attention(kiln.asarray(qkv), scale)), want, rtol=1e-5,
                               atol=1e-5)
