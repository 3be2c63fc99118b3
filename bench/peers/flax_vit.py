"""transformers' ViTForImageClassification written in flax.linen, for machines
whose transformers (5.x) no longer ships FlaxViTForImageClassification. Same
architecture as modeling_vit.py with eager attention and no dropout; NHWC
pixels; `from_torch_state_dict` loads a PyTorch ViT's weights."""
import math
import re
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

_init = nn.initializers.truncated_normal(0.02)


class Layer(nn.Module):
    hidden: int
    heads: int
    mlp: int
    eps: float
    dtype: Any = jnp.float32  # the matmuls' (bfloat16: mixed precision; parameters stay f32)

    @nn.compact
    def __call__(self, x):
        b, t, c = x.shape
        dh = c // self.heads
        y = nn.LayerNorm(epsilon=self.eps, name="layernorm_before")(x)

        def split(z):
            return z.reshape(b, t, self.heads, dh).transpose(0, 2, 1, 3)

        q = split(nn.Dense(c, kernel_init=_init, dtype=self.dtype, name="query")(y))
        k = split(nn.Dense(c, kernel_init=_init, dtype=self.dtype, name="key")(y))
        v = split(nn.Dense(c, kernel_init=_init, dtype=self.dtype, name="value")(y))
        probs = nn.softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh), axis=-1)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, t, c)
        x = x + nn.Dense(c, kernel_init=_init, dtype=self.dtype, name="attention_output")(ctx)
        y = nn.LayerNorm(epsilon=self.eps, name="layernorm_after")(x)
        y = nn.gelu(nn.Dense(self.mlp, kernel_init=_init, dtype=self.dtype, name="intermediate")(y), approximate=False)
        return x + nn.Dense(c, kernel_init=_init, dtype=self.dtype, name="output")(y)


class ViTForImageClassification(nn.Module):
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    num_labels: int = 1000
    patch_size: int = 16
    layer_norm_eps: float = 1e-12
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, pixels_nhwc):
        p, c = self.patch_size, self.hidden_size
        x = nn.Conv(c, (p, p), strides=(p, p), padding="VALID", kernel_init=_init,
                    dtype=self.dtype, name="patch_embeddings")(pixels_nhwc)
        b, gh, gw, _ = x.shape
        x = x.reshape(b, gh * gw, c)
        cls = self.param("cls_token", _init, (1, 1, c))
        pos = self.param("position_embeddings", _init, (1, gh * gw + 1, c))
        x = jnp.concatenate([jnp.broadcast_to(cls, (b, 1, c)), x], axis=1) + pos
        for i in range(self.num_hidden_layers):
            x = Layer(c, self.num_attention_heads, self.intermediate_size, self.layer_norm_eps,
                      self.dtype, name=f"layer_{i}")(x)
        x = nn.LayerNorm(epsilon=self.layer_norm_eps, name="layernorm")(x)
        logits = nn.Dense(self.num_labels, kernel_init=_init, dtype=self.dtype, name="classifier")(x[:, 0])
        return logits.astype(jnp.float32)


# transformers 5 renamed the encoder's modules (its checkpoints keep the
# 4.x names on disk): new name -> 4.x name, per layer.
_V5_NAMES = {"attention.q_proj": "attention.attention.query", "attention.k_proj": "attention.attention.key",
             "attention.v_proj": "attention.attention.value", "attention.o_proj": "attention.output.dense",
             "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}


def _legacy_name(key):
    m = re.match(r"vit\.layers\.(\d+)\.(.*)\.(weight|bias)$", key)
    if not m:
        return key
    i, module, kind = m.groups()
    return f"vit.encoder.layer.{i}.{_V5_NAMES.get(module, module)}.{kind}"


def from_torch_state_dict(sd, num_layers):
    """Flax parameters from a PyTorch ViTForImageClassification state_dict
    (transformers 4.x or 5.x names)."""
    t = {_legacy_name(k): np.asarray(v.detach().cpu().numpy()) for k, v in sd.items()}

    def dense(name):
        return {"kernel": t[name + ".weight"].T, "bias": t[name + ".bias"]}

    def norm(name):
        return {"scale": t[name + ".weight"], "bias": t[name + ".bias"]}

    e = "vit.embeddings."
    params = {
        "patch_embeddings": {"kernel": t[e + "patch_embeddings.projection.weight"].transpose(2, 3, 1, 0),
                             "bias": t[e + "patch_embeddings.projection.bias"]},
        "cls_token": t[e + "cls_token"],
        "position_embeddings": t[e + "position_embeddings"],
        "layernorm": norm("vit.layernorm"),
        "classifier": dense("classifier"),
    }
    for i in range(num_layers):
        pre = f"vit.encoder.layer.{i}."
        params[f"layer_{i}"] = {
            "layernorm_before": norm(pre + "layernorm_before"),
            "layernorm_after": norm(pre + "layernorm_after"),
            "query": dense(pre + "attention.attention.query"),
            "key": dense(pre + "attention.attention.key"),
            "value": dense(pre + "attention.attention.value"),
            "attention_output": dense(pre + "attention.output.dense"),
            "intermediate": dense(pre + "intermediate.dense"),
            "output": dense(pre + "output.dense"),
        }
    return params
