"""jit: equal to eager, compiled once per signature, trees, static and
donated arguments, values read while tracing, freeing; and the lazy mode."""
import gc
import weakref

import numpy as np
import pytest

import kiln
import kiln.nn.functional as F


def _mlp(params, x, y):
    h = kiln.relu(F.linear(x, params["w1"], params["b1"]))
    return F.cross_entropy(F.linear(h, params["w2"], params["b2"]), y)


def _params(rng):
    return {"w1": kiln.asarray(rng.standard_normal((16, 8)).astype(np.float32) * 0.3),
            "b1": kiln.zeros((16,)),
            "w2": kiln.asarray(rng.standard_normal((4, 16)).astype(np.float32) * 0.3),
            "b2": kiln.zeros((4,))}


def _step(params, x, y, lr):
    loss, g = kiln.value_and_grad(_mlp)(params, x, y)
    return kiln.tree.map(lambda p, d: p - lr * d, params, g), loss


def test_jit_equals_eager(rng):
    params = _params(rng)
    x = kiln.asarray(rng.standard_normal((32, 8)).astype(np.float32))
    y = kiln.asarray(rng.integers(0, 4, 32).astype(np.int32))
    eager_p, eager_l = _step(params, x, y, 0.1)
    step = kiln.jit(_step, static_argnums=3)
    jit_p, jit_l = step(params, x, y, 0.1)
    assert jit_l.item() == pytest.approx(eager_l.item(), rel=1e-6)
    for k in params:
        np.testing.assert_allclose(np.asarray(jit_p[k]), np.asarray(eager_p[k]), rtol=1e-5,
                                   atol=1e-6)
    with kiln.lazy():
        lazy_p, lazy_l = _step(params, x, y, 0.1)
        kiln.mark_step(lazy_p, lazy_l)
    assert lazy_l.is_materialized
    assert lazy_l.item() == pytest.approx(eager_l.item(), rel=1e-6)


def test_compilation_counts():
    f = kiln.jit(lambda x, n: x * n + 1.0, static_argnums=1)
    a, b = kiln.ones((3,)), kiln.zeros((3,))
    f(a, 2.0), f(b, 2.0), f(a, 2.0)
    assert f.cache_stats()["compiles"] == 1  # same shapes: traced once
    assert f.cache_stats()["hits"] == 2
    f(kiln.ones((4,)), 2.0)
    assert f.cache_stats()["compiles"] == 2  # a new shape
    np.testing.assert_allclose(np.asarray(f(a, 3.0)), [4, 4, 4])
    assert f.cache_stats()["compiles"] == 3  # a new static value
    f(kiln.ones((3,), "float64"), 2.0)
    assert f.cache_stats()["compiles"] == 4  # a new dtype
    g = kiln.jit(lambda t: t["a"] + t["b"][0])
    g({"a": a, "b": [a]})
    g({"a": a, "b": (a,)})  # a new tree structure
    assert g.cache_stats()["compiles"] == 2


def test_negative_argnums():
    f = kiln.jit(lambda x, n: x * n, static_argnums=-1)
    np.testing.assert_array_equal(np.asarray(f(kiln.ones((2,)), 3.0)), [3, 3])
    g = kiln.jit(lambda x, y: x + y, donate_argnums=-1)
    y = kiln.ones((2,)) * 1.0
    g(kiln.ones((2,)), y)
    with pytest.raises(kiln.KilnError, match="donated"):
        y.item() if y.size == 1 else np.asarray(y)


def test_trees_and_numbers(rng):
    @kiln.jit
    def f(tree, scale):
        return {"sum": tree["x"] + tree["y"][0], "scaled": tree["x"] * scale}, [tree["x"]]

    x = kiln.ones((2,))
    out, rest = f({"x": x, "y": [kiln.full((2,), 2.0)]}, 3.0)
    np.testing.assert_array_equal(np.asarray(out["sum"]), [3, 3])
    np.testing.assert_array_equal(np.asarray(out["scaled"]), [3, 3])
    assert isinstance(rest, list) and rest[0].shape == (2,)
    out2, _ = f({"x": x, "y": [kiln.full((2,), 2.0)]}, 4.0)  # numbers are traced, not static
    np.testing.assert_array_equal(np.asarray(out2["scaled"]), [4, 4])
    assert f.cache_stats()["compiles"] == 1


def test_donation(rng):
    step = kiln.jit(_step, static_argnums=3, donate_argnums=0)
    params = _params(rng)
    x = kiln.asarray(rng.standard_normal((8, 8)).astype(np.float32))
    y = kiln.asarray(rng.integers(0, 4, 8).astype(np.int32))
    want, _ = _step(params, x, y, 0.1)
    new, _ = step(params, x, y, 0.1)
    np.testing.assert_allclose(np.asarray(new["w1"]), np.asarray(want["w1"]), rtol=1e-5, atol=1e-6)
    with pytest.raises(kiln.KilnError, match="donated"):
        np.asarray(params["w1"])
    view = np.asarray(new["w1"])
    with pytest.raises(kiln.KilnError, match="viewed by numpy"):
        step(new, x, y, 0.1)
    del view
    gc.collect()
    step(new, x, y, 0.1)


def test_reading_a_value_while_tracing_is_an_error():
    @kiln.jit
    def f(x):
        if x.sum() > 0:  # a value the trace does not have
            return x
        return -x

    with pytest.raises(kiln.KilnError, match="traced"):
        f(kiln.ones((3,)))
    with pytest.raises(kiln.KilnError, match="traced"):
        kiln.jit(lambda x: float(x[0]))(kiln.ones((3,)))


def test_python_exceptions_pass_through():
    class Boom(Exception):
        pass

    def f(x):
        raise Boom("inside jit")

    with pytest.raises(Boom, match="inside jit"):
        kiln.jit(f)(kiln.ones((2,)))


def test_a_jitted_function_is_freed_after_del():
    class Model:
        def __call__(self, x):
            return x * 2.0

    model = Model()
    alive = weakref.ref(model)
    f = kiln.jit(model)
    f(kiln.ones((2,)))
    assert f.cache_stats()["compiles"] == 1
    del model
    assert alive() is not None  # held by the jitted function
    del f
    gc.collect()
    assert alive() is None


def test_a_reference_cycle_through_jit_is_collected():
    holder = {}

    def fn(x):
        return x + holder["f"].cache_stats()["compiles"]  # fn reaches the jitted function

    marker = weakref.ref(fn)
    holder["f"] = kiln.jit(fn)
    holder["f"](kiln.ones((1,)))
    del fn, holder
    gc.collect()
    assert marker() is None


def test_lazy_records_until_read():
    with kiln.lazy():
        assert kiln.is_lazy()
        a = kiln.ones((3,)) * 2.0
        assert not a.is_materialized
        b = a + 1.0
        np.testing.assert_array_equal(np.asarray(b), [3, 3, 3])  # reading runs it
    assert not kiln.is_lazy()
    before = kiln.lazy_cache_stats()["compiles"]
    for _ in range(3):
        with kiln.lazy():
            c = kiln.ones((5,)) * 3.0 - 1.0
            kiln.mark_step(c)
        assert c.is_materialized
    assert kiln.lazy_cache_stats()["compiles"] == before + 1  # the same graph each step


class Linear:
    """A registered tree node: its arrays are children, its name is static."""

    def __init__(self, w, b, name):
        self.w, self.b, self.name = w, b, name


kiln.tree.register(Linear, lambda m: ((m.w, m.b), m.name), lambda name, c: Linear(*c, name))


def test_registered_classes_are_trees():
    m = Linear(kiln.ones((2, 3)), kiln.zeros((3,)), "fc")
    leaves, d = kiln.tree.flatten({"fc": m, "n": None})
    assert len(leaves) == 2 and d.num_leaves == 2
    paths = kiln.tree.flatten_with_path({"fc": m})[0]
    assert paths == [("fc", 0), ("fc", 1)]
    g = kiln.grad(lambda m, x: kiln.sum(x @ m.w + m.b))(m, kiln.ones((4, 2)))
    assert isinstance(g, Linear) and g.name == "fc"
    np.testing.assert_array_equal(np.asarray(g.w), np.full((2, 3), 4.0))
    np.testing.assert_array_equal(np.asarray(g.b), np.full((3,), 4.0))
    f = kiln.jit(lambda m: Linear(m.w * 2.0, m.b, m.name + "2"))
    out = f(m)
    assert out.name == "fc2" and np.asarray(out.w)[0, 0] == 2
    f(Linear(m.w, m.b, "other"))  # the static part keys the cache
    assert f.cache_stats()["compiles"] == 2
