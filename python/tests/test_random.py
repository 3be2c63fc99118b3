"""kiln.random's draws beyond the normal and uniform ones: gamma, beta,
randint and categorical, by their moments and frequencies, as pure functions
of the key."""
import numpy as np
import pytest

import kiln


def test_gamma_and_beta_have_their_moments():
    g = np.asarray(kiln.random.gamma(kiln.random.key(1), 2.5, (100000,), dtype=kiln.float64))
    assert abs(g.mean() - 2.5) < 0.03 and abs(g.var() - 2.5) < 0.1
    b = np.asarray(kiln.random.beta(kiln.random.key(2), 2.0, 5.0, (100000,)))
    assert b.min() >= 0 and b.max() <= 1
    assert abs(b.mean() - 2 / 7) < 0.005
    again = np.asarray(kiln.random.beta(kiln.random.key(2), 2.0, 5.0, (100000,)))
    assert np.array_equal(b, again)


def test_randint_and_categorical_draw_their_frequencies():
    r = np.asarray(kiln.random.randint(kiln.random.key(3), (80000,), -2, 6))
    assert r.dtype == np.int32 and r.min() == -2 and r.max() == 5
    assert np.all(np.abs(np.bincount(r + 2) - 10000) < 450)
    logits = np.tile(np.array([0.0, 1.0, 2.0], np.float32), (60000, 1))
    c = np.asarray(kiln.random.categorical(kiln.random.key(4), logits))
    p = np.exp([0.0, 1.0, 2.0]) / np.exp([0.0, 1.0, 2.0]).sum()
    assert np.all(np.abs(np.bincount(c, minlength=3) / 60000 - p) < 0.01)


def test_bad_parameters_name_the_draw():
    with pytest.raises(Exception, match="random.gamma"):
        kiln.random.gamma(kiln.random.key(0), 0.0, (3,))
    with pytest.raises(Exception, match="high must be above low"):
        kiln.random.randint(kiln.random.key(0), (3,), 4, 4)
