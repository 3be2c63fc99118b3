"""kiln releases the GIL while it computes: a Python thread keeps running
during a large matmul and a jitted step. The control, a C call that holds
the GIL (a regular expression that backtracks), shows the counter stalls
when the GIL is held, so the test can fail."""
import re
import threading
import time

import numpy as np

import kiln


def _count_during(work):
    """How many times a Python thread counted while work() ran, and its seconds."""
    count = [0]
    stop = threading.Event()
    started = threading.Event()

    def counter():
        started.set()
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=counter)
    t.start()
    started.wait()
    before = count[0]
    t0 = time.perf_counter()
    work()
    seconds = time.perf_counter() - t0
    during = count[0] - before
    stop.set()
    t.join()
    return during, seconds


def _holds_the_gil():
    re.match(r"(a+)+$", "a" * 24 + "b")  # exponential backtracking inside one C call


def _share(work):
    """The counter's rate during work() as a share of its rate while the
    main thread sleeps (the GIL free)."""
    free, free_s = _count_during(lambda: time.sleep(0.2))
    during, seconds = _count_during(work)
    assert seconds > 0.05, "the work is too short to measure"
    return (during / seconds) / (free / free_s)


def test_the_control_stalls_the_counter():
    assert _share(_holds_the_gil) < 0.1


def test_a_large_matmul_releases_the_gil():
    a = kiln.ones((1500, 1500))
    (a @ a).eval()  # warm up
    assert _share(lambda: [(a @ a).eval() for _ in range(3)]) > 0.3


def test_a_jitted_step_releases_the_gil():
    step = kiln.jit(lambda x: kiln.sum(kiln.tanh(x @ x) @ x))
    x = kiln.asarray(np.ones((1200, 1200), np.float32) * 1e-3)
    step(x).eval()  # compiled
    assert _share(lambda: [step(x).eval() for _ in range(3)]) > 0.3


def test_a_loaders_next_batch_releases_the_gil():
    data = kiln.data.RandomImages(num_samples=1 << 12, num_labels=10, image_size=224)
    loader = kiln.data.Loader(data, batch_size=64, workers=0)  # made on the calling thread
    next(loader)
    assert _share(lambda: [next(loader) for _ in range(3)]) > 0.3


def test_threads_share_eager_ops_and_a_jitted_function():
    x = kiln.asarray(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32))
    f = kiln.jit(lambda a: kiln.sum(kiln.tanh(a @ a), axis=0))
    want_eager = np.asarray(kiln.exp(x * 0.1) @ x)
    want_jit = np.asarray(f(x))
    errors = []

    def work():
        try:
            for _ in range(50):
                np.testing.assert_allclose(np.asarray(kiln.exp(x * 0.1) @ x), want_eager, rtol=1e-6)
                np.testing.assert_allclose(np.asarray(f(x)), want_jit, rtol=1e-6)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert f.cache_stats()["compiles"] == 1
