"""Neural networks: the layers kiln's model families are built of (Linear,
Conv2d, LayerNorm, BatchNorm2d, Embedding, MultiHeadAttention, MLP, Dropout,
DropPath) as classes over parameter trees, HuggingFace's
ViTForImageClassification over its parameter tree (flat dicts of
HuggingFace's parameter names), and ``kiln.nn.functional``. Models of
every family: ``kiln.models``."""
from __future__ import annotations

import copy as _copy
from typing import Any, Sequence

from .. import _kiln
from .._array import Array, Device, _device, _precision_dtype, asarray
from .._kiln import Layout, ViTConfig
from ..random import Key
from . import functional, layers
from .layers import (MLP, BatchNorm2d, Conv2d, DropPath, Dropout, Embedding, Init, LayerNorm,
                     Linear, MultiHeadAttention)

__all__ = ["ViTConfig", "ViTForImageClassification", "Layout", "functional", "layers",
           *layers.__all__]

def _from_pretrained_config(src: str) -> ViTConfig:
    """The config of a pretrained model: a folder that transformers saved or
    a Hub id (the local cache, else a download; see
    ViTForImageClassification.from_pretrained)."""
    return _kiln._load_pretrained(src)[0]


ViTConfig.from_pretrained = staticmethod(_from_pretrained_config)



class ViTForImageClassification:
    """transformers' ViTForImageClassification with its parameter names and
    shapes, as a pure function of a parameter dict (Flax's style):

        model = kiln.nn.ViTForImageClassification(kiln.nn.ViTConfig("vit-tiny"))
        params = model.init(kiln.random.key(0))
        logits = model.apply(params, pixel_values)          # [B, C, H, W]
        loss = model.loss(logits, labels)
    """

    def __init__(self, config: ViTConfig):
        config.validate()
        self.config = _copy.copy(config)
        self._vit = _kiln._ViT(self.config)

    def init(self, key: Key, device: Any = None) -> dict:
        """HuggingFace's initialization (truncated normal weights, zero
        biases, unit LayerNorms), drawn on ``device``."""
        return self._vit.init(key, _device(device) or Device("cpu"))

    def parameter_shapes(self) -> dict:
        return {name: tuple(shape) for name, shape in self._vit.parameter_shapes()}

    def apply(self, params: dict, pixel_values: Any, *, layout: str = "NCHW",
              train: bool = False, dropout_key: Any = None, precision: str = "fp32",
              fused_attention: bool = True, inference: bool = False) -> Array:
        """The logits [B, num_labels] of pixel_values [B, C, H, W] (or
        [B, H, W, C] with layout="NHWC"). ``train`` turns dropout on, drawn
        from ``dropout_key`` (a Key, or its kiln.random.key_data array inside
        jit); ``precision`` "bf16" rounds the matmuls' operands to bf16.
        ``inference``: no gradient will be taken (prediction, evaluation);
        in bf16 the MLP's activation then reads the f32 sum, which jit fuses
        into the GEMM. A jitted function that closes over ``params`` instead
        of taking them casts and concatenates the weights once, when it
        compiles."""
        matmul_dtype = _precision_dtype(precision)
        key = key_array = None
        if isinstance(dropout_key, Key):
            key = dropout_key
        elif dropout_key is not None:
            key_array = asarray(dropout_key)
        return self._vit.apply(params, asarray(pixel_values), getattr(Layout, layout), train, key,
                               key_array, matmul_dtype, fused_attention, inference)

    __call__ = apply

    def loss(self, logits: Array, labels: Any, label_smoothing: float = 0.0) -> Array:
        """The mean loss transformers computes for the config's problem type
        (softmax cross-entropy for integer labels)."""
        return self._vit.loss(logits, asarray(labels), float(label_smoothing))

    @classmethod
    def from_pretrained(cls, src: str, labels: Sequence[str] | None = None,
                        image_size: Any = None, seed: int = 0):
        """``(model, params)`` of a pretrained ViT: a folder that
        transformers' save_pretrained wrote, or a Hub id ("org/name[@rev]")
        from the local Hugging Face cache, downloaded there when absent (as
        ``kiln train --init-from``). ``labels`` (names) give it a new
        classifier when they differ from the checkpoint's, as
        ``ignore_mismatched_sizes`` does; ``image_size`` resamples the
        position embeddings as ``interpolate_pos_encoding``."""
        from ..random import key as _key
        config, params, notes = _kiln._adapt_classifier(src, list(labels or []), _key(seed),
                                                        image_size)
        model = cls(config)
        model.notes = notes
        return model, params

    def save_pretrained(self, directory: str, params: dict) -> None:
        """Writes ``directory`` as transformers' save_pretrained does
        (config.json, model.safetensors), atomically."""
        _kiln._save_pretrained(str(directory), self.config, params)
