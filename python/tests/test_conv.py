"""kiln's convolution, pooling and channel normalization against PyTorch's
torch.nn.functional (values and gradients): torch's results are the committed
fixture tests/fixtures/python_nn/golden.npz (tools/golden/make_python_nn_golden.py),
for inputs drawn here as the generator draws them."""
import os

import numpy as np
import pytest

import kiln

GOLDEN = np.load(os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures",
                              "python_nn", "golden.npz"))


def _np(x):
    return np.asarray(x)


def _draw(rng, *shape):
    return kiln.array(rng.standard_normal(shape).astype(np.float64))


CONV_KWS = [
    dict(),
    dict(stride=2, padding=1),
    dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
    dict(padding="same", groups=2),
    dict(stride=3, padding="valid"),
]


@pytest.mark.parametrize("case", range(len(CONV_KWS)))
def test_conv2d_and_its_gradients_match_torch(case):
    kw = CONV_KWS[case]
    rng = np.random.default_rng(0)
    x, w, b = _draw(rng, 2, 4, 9, 8), _draw(rng, 6, 4 // kw.get("groups", 1), 3, 3), _draw(rng, 6)
    y = kiln.conv2d(x, w, b, **kw)
    np.testing.assert_allclose(_np(y), GOLDEN[f"conv2d/{case}/y"], rtol=1e-10, atol=1e-10)
    g = kiln.grad(lambda a, c, d: kiln.sum(kiln.square(kiln.conv2d(a, c, d, **kw))),
                  argnums=(0, 1, 2))(x, w, b)
    for got, name in zip(g, ("dx", "dw", "db")):
        np.testing.assert_allclose(_np(got), GOLDEN[f"conv2d/{case}/{name}"], rtol=1e-9, atol=1e-9)


def test_conv2d_channels_last_and_conv1d():
    rng = np.random.default_rng(1)
    x, w = _draw(rng, 2, 3, 7, 7), _draw(rng, 5, 3, 3, 3)
    y = kiln.conv2d(kiln.transpose(x, [0, 2, 3, 1]), w, stride=2, padding=1, channels_last=True)
    np.testing.assert_allclose(_np(y).transpose(0, 3, 1, 2), GOLDEN["conv2d_strided/y"], rtol=1e-10)
    x1, w1 = _draw(rng, 2, 3, 11), _draw(rng, 4, 3, 3)
    np.testing.assert_allclose(_np(kiln.conv1d(x1, w1, padding="same", dilation=2)),
                               GOLDEN["conv1d/y"], rtol=1e-10)


def test_pooling_matches_torch():
    rng = np.random.default_rng(2)
    x = _draw(rng, 2, 3, 9, 8)
    np.testing.assert_allclose(_np(kiln.max_pool2d(x, 3, 2, 1)), GOLDEN["max_pool2d/y"])
    np.testing.assert_allclose(_np(kiln.avg_pool2d(x, 3, 2, 1, count_include_pad=False)),
                               GOLDEN["avg_pool2d/y"], rtol=1e-12)
    np.testing.assert_allclose(_np(kiln.adaptive_avg_pool2d(x, 4, 3)),
                               GOLDEN["adaptive_avg_pool2d/y"], rtol=1e-12)
    g = kiln.grad(lambda a: kiln.sum(kiln.square(kiln.max_pool2d(a, 3, 2, 1))))(x)
    np.testing.assert_allclose(_np(g), GOLDEN["max_pool2d/dx"])


def test_batch_norm_and_group_norm_match_torch():
    rng = np.random.default_rng(3)
    x = _draw(rng, 4, 3, 5, 5)
    rm, rv = np.array([0.1, -0.2, 0.3]), np.array([1.0, 2.0, 0.5])
    y, m, v = kiln.batch_norm(x, kiln.array(rm), kiln.array(rv), training=True, momentum=0.2)
    np.testing.assert_allclose(_np(y), GOLDEN["batch_norm/y"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(_np(m), GOLDEN["batch_norm/running_mean"], rtol=1e-12)
    np.testing.assert_allclose(_np(v), GOLDEN["batch_norm/running_var"], rtol=1e-12)
    y, m, v = kiln.batch_norm(x)  # no running statistics: the batch's, and None back
    assert m is None and v is None
    w, x6 = _draw(rng, 6), _draw(rng, 2, 6, 3, 4)
    np.testing.assert_allclose(_np(kiln.group_norm(x6, 3, w)), GOLDEN["group_norm/y"], rtol=1e-9,
                               atol=1e-12)


def test_bad_arguments_raise_kiln_errors():
    x = kiln.zeros([1, 3, 4, 4])
    with pytest.raises(kiln.KilnError, match="does not fit the input 4x4"):
        kiln.conv2d(x, kiln.zeros([2, 3, 5, 5]))
    with pytest.raises(kiln.KilnError, match="padding 'full'"):
        kiln.conv2d(x, kiln.zeros([2, 3, 1, 1]), padding="full")
