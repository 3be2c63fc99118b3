"""kiln.nn's layer classes against torch.nn's modules given the same weights
(values, gradients, BatchNorm's running statistics), their parameter trees,
random sites inside and outside jit, and their errors. torch's results are the
committed fixture tests/fixtures/python_nn/golden.npz
(tools/golden/make_python_nn_golden.py), for weights and inputs drawn here as
the generator draws them."""
import os

import numpy as np
import pytest

import kiln
from kiln import nn

GOLDEN = np.load(os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures",
                              "python_nn", "golden.npz"))


def _np(x):
    return np.asarray(x)


def _x(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_linear_is_torchs_and_names_its_parameters():
    fc = nn.Linear(6, 4, name="enc.fc")
    assert fc.parameter_shapes() == {"enc.fc.weight": (4, 6), "enc.fc.bias": (4,)}
    init = fc.init(kiln.random.key(0))
    assert {k: v.shape for k, v in init.items()} == fc.parameter_shapes()
    params = {"enc.fc.weight": kiln.array(_x(20, 4, 6)), "enc.fc.bias": kiln.array(_x(21, 4))}
    x = _x(1, 3, 6)
    np.testing.assert_allclose(_np(fc(params, x)), GOLDEN["linear/y"], rtol=1e-5, atol=1e-6)
    # Gradients through the layer, and the same under jit.
    g = kiln.grad(lambda p: kiln.sum(kiln.square(fc(p, x))))(params)
    np.testing.assert_allclose(_np(g["enc.fc.weight"]), GOLDEN["linear/dw"], rtol=1e-4, atol=1e-5)
    jitted = kiln.jit(lambda p, a: fc(p, a))
    np.testing.assert_allclose(_np(jitted(params, x)), _np(fc(params, x)), rtol=1e-6, atol=1e-6)
    # torch's own initialization: uniform ±1/√fan_in.
    w = _np(nn.Linear(400, 300, weight_init=nn.Init.torch_default(400)).init(kiln.random.key(1))["weight"])
    assert np.abs(w).max() <= 0.05 and np.abs(w).max() > 0.049


CONV_KWS = [
    dict(kernel_size=3, padding=1),
    dict(kernel_size=3, stride=(2, 1), padding=(1, 2), dilation=(1, 2)),
    dict(kernel_size=7, padding=3, groups=4),
    dict(kernel_size=3, padding="same", groups=2),
    dict(kernel_size=4, stride=4),
]


@pytest.mark.parametrize("case", range(len(CONV_KWS)))
def test_conv2d_is_torchs_in_each_layout(case):
    kw = CONV_KWS[case]
    conv = nn.Conv2d(4, 8, **kw)
    k, groups = kw["kernel_size"], kw.get("groups", 1)
    assert conv.parameter_shapes() == {"weight": (8, 4 // groups, k, k), "bias": (8,)}
    params = {"weight": kiln.array(_x(22 + case, 8, 4 // groups, k, k)),
              "bias": kiln.array(_x(32 + case, 8))}
    x = _x(3, 2, 4, 13, 12)
    want = GOLDEN[f"layer_conv2d/{case}/y"]
    np.testing.assert_allclose(_np(conv(params, x)), want, rtol=1e-4, atol=1e-4)
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    np.testing.assert_allclose(_np(conv(params, nhwc, layout="NHWC", out_layout="NCHW")), want,
                               rtol=1e-4, atol=1e-4)


def test_a_patch_matmul_is_the_convolution():
    patch = nn.Conv2d(3, 8, 4, stride=4, patch_matmul=True)
    params = patch.init(kiln.random.key(4))
    x = _x(5, 2, 3, 10, 13)
    want = _np(nn.Conv2d(3, 8, 4, stride=4)(params, x))
    np.testing.assert_allclose(_np(patch(params, x)), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(kiln.KilnError, match="needs stride = kernel"):
        nn.Conv2d(3, 8, 4, stride=2, patch_matmul=True)(params, x)


def test_layer_norm_over_channels_last_or_first():
    ln = nn.LayerNorm(5, eps=1e-6)
    params = {"weight": kiln.array(_x(6, 5)), "bias": kiln.array(_x(7, 5))}
    x = _x(8, 2, 3, 5)
    want = GOLDEN["layer_norm/y"]
    np.testing.assert_allclose(_np(ln(params, x)), want, rtol=1e-5, atol=1e-5)
    first = nn.LayerNorm(5, eps=1e-6, channels_first=True)
    xc = np.ascontiguousarray(x.transpose(0, 2, 1))  # [N, C, L]
    np.testing.assert_allclose(_np(first(params, xc)), want.transpose(0, 2, 1),
                               rtol=1e-5, atol=1e-5)


def test_batch_norm_trains_its_statistics_as_torch_does():
    bn = nn.BatchNorm2d(3, name="bn")
    params, state = bn.init(kiln.random.key(0)), bn.init_state()
    assert sorted(state) == ["bn.num_batches_tracked", "bn.running_mean", "bn.running_var"]
    x = _x(9, 4, 3, 5, 5) * 2 + 1  # torch.nn.BatchNorm2d(3) as created: weight 1, bias 0
    y, state = bn(params, x, state, train=True)
    np.testing.assert_allclose(_np(y), GOLDEN["batch_norm2d/y_train"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(_np(state["bn.running_mean"]), GOLDEN["batch_norm2d/running_mean"],
                               rtol=1e-5)
    np.testing.assert_allclose(_np(state["bn.running_var"]), GOLDEN["batch_norm2d/running_var"],
                               rtol=1e-5)
    assert int(_np(state["bn.num_batches_tracked"])) == 1
    ye, same = bn(params, x, state)
    np.testing.assert_allclose(_np(ye), GOLDEN["batch_norm2d/y_eval"], rtol=1e-4, atol=1e-4)
    assert int(_np(same["bn.num_batches_tracked"])) == 1


def test_embedding_reads_rows():
    emb = nn.Embedding(10, 3, name="wte")
    params = emb.init(kiln.random.key(3))
    ids = np.array([[7, 0], [7, 9]], dtype=np.int32)
    np.testing.assert_array_equal(_np(emb(params, ids)), _np(params["wte.weight"])[ids])
    with pytest.raises(kiln.KilnError, match="expected integers"):
        emb(params, ids.astype(np.float32))


def test_attention_is_torchs_and_fused_equals_unfused():
    mha = nn.MultiHeadAttention(8, 2, name="attn")
    assert list(mha.parameter_shapes())[:2] == ["attn.query.weight", "attn.query.bias"]
    params = {}
    for j, name in enumerate(("query", "key", "value", "output")):
        params[f"attn.{name}.weight"] = kiln.array(_x(40 + j, 8, 8))
        params[f"attn.{name}.bias"] = kiln.array(_x(50 + j, 8))
    assert {k: v.shape for k, v in params.items()} == mha.parameter_shapes()
    x = _x(10, 2, 5, 8)
    for fused in (True, False):
        np.testing.assert_allclose(_np(mha(params, x, fused_attention=fused)), GOLDEN["attention/y"],
                                   rtol=1e-4, atol=1e-5)


def test_attention_over_q_k_v_is_torchs_sdpa_with_its_gradients():
    rng = np.random.default_rng(12)
    B, T, S, H, D = 2, 5, 7, 2, 4
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((B, T, H, D), (B, S, H, D), (B, S, H, D)))
    bias = rng.standard_normal((1, H, T, S)).astype(np.float32)
    keep = np.ones((B, S), bool)
    keep[0, 5:] = False
    w = rng.standard_normal((B, T, H, D)).astype(np.float32)

    def kiln_loss(q, k, v, bias):
        y = kiln.attention(q, k, v, causal=True, bias=bias, key_padding_mask=keep)
        return kiln.sum(y * w)

    # kiln's causal mask is aligned to the last key (query i sees keys j <= i + S - T):
    # the generator gives torch's SDPA that mask spelled out (its is_causal
    # aligns to the first).
    q, k, v, bias, w, keep = (kiln.asarray(a) for a in (q, k, v, bias, w, keep))
    got = kiln.attention(q, k, v, causal=True, bias=bias, key_padding_mask=keep)
    np.testing.assert_allclose(_np(got), GOLDEN["sdpa/y"], rtol=1e-5, atol=1e-6)
    grads = kiln.grad(kiln_loss, argnums=(0, 1, 2, 3))(q, k, v, bias)
    for g, name in zip(grads, ("dq", "dk", "dv", "dbias")):
        np.testing.assert_allclose(_np(g), GOLDEN[f"sdpa/{name}"], rtol=1e-4, atol=1e-5)
    with pytest.raises(kiln.KilnError, match="key_padding_mask must be bool"):
        kiln.attention(q, k, v, key_padding_mask=kiln.astype(keep, "float32"))


def test_mlp_and_its_activation():
    mlp = nn.MLP(4, 16, "relu", name="ffn")
    assert list(mlp.parameter_shapes()) == ["ffn.fc1.weight", "ffn.fc1.bias", "ffn.fc2.weight",
                                            "ffn.fc2.bias"]
    params = mlp.init(kiln.random.key(6))
    x = _x(11, 3, 4)
    p = {k: _np(v) for k, v in params.items()}
    want = np.maximum(x @ p["ffn.fc1.weight"].T + p["ffn.fc1.bias"], 0) @ p["ffn.fc2.weight"].T + p["ffn.fc2.bias"]
    np.testing.assert_allclose(_np(mlp(params, x)), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(kiln.KilnError, match="unknown activation 'swiglu'"):
        nn.MLP(4, 16, "swiglu")


def test_dropout_and_drop_path_draw_from_the_key_alike_in_jit():
    x = np.ones((32, 16), np.float32)
    drop, path = nn.Dropout(0.25), nn.DropPath(0.5)
    np.testing.assert_array_equal(_np(drop({}, x)), x)  # evaluation: off
    key = kiln.random.key(7)
    y = _np(drop({}, x, train=True, key=key))
    assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.75)}
    assert 0.6 < (y != 0).mean() < 0.9
    jitted = kiln.jit(lambda a, k: drop({}, a, train=True, key=k))
    np.testing.assert_array_equal(_np(jitted(x, kiln.random.key_data(key))), y)
    z = _np(path({}, x, train=True, key=key))
    assert all(len(set(row)) == 1 for row in z)  # whole examples kept or dropped
    assert set(np.unique(z)) <= {0.0, 2.0}


def test_bad_options_are_clear_errors():
    with pytest.raises(kiln.KilnError, match="precision 'fp8'"):
        nn.Linear(2, 2)({}, np.ones((1, 2), np.float32), precision="fp8")
    with pytest.raises(kiln.KilnError, match="missing parameter 'weight'"):
        nn.Linear(2, 2)({}, np.ones((1, 2), np.float32))
    with pytest.raises(kiln.KilnError, match="not a multiple of heads"):
        nn.MultiHeadAttention(10, 3)
