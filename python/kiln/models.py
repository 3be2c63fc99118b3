"""Models of every family kiln has (ViT, DeiT, ResNet, ConvNeXt, GPT-2),
made from transformers' config.json by its ``model_type`` as
``AutoModelForImageClassification`` (``AutoModelForCausalLM``) makes them,
over parameter and state trees (flat dicts of HuggingFace's names):

    model, params, state = kiln.models.from_pretrained("microsoft/resnet-50")
    logits, state = model.apply(params, state, pixel_values, train=True)
    loss = model.loss(logits, labels)

    gpt2, params, _ = kiln.models.from_pretrained("gpt2")
    tok = kiln.data.Tokenizer.from_folder(kiln.models.model_folder("gpt2"))
    ids = gpt2.generate(params, tok.encode("Hello"), max_new_tokens=20)

The state is what a model keeps besides its parameters (a ResNet's
BatchNorm running statistics; empty for a ViT): ``apply`` returns it updated
in training and as given in evaluation.
"""
from __future__ import annotations

import json as _json
import os as _os
from typing import Any, NamedTuple, Sequence

import numpy as _np

from . import _kiln
from ._array import Array, Device, _device, _precision_dtype, asarray
from ._kiln import Layout
from .random import Key, _key_operand

__all__ = ["Model", "Pretrained", "from_config", "from_preset", "from_pretrained", "model_folder",
           "model_types", "presets"]



class Model:
    """One model of any family, as a pure function of its parameter and
    state dicts. Made by :func:`from_config`, :func:`from_preset` or
    :func:`from_pretrained`."""

    def __init__(self, native: Any):
        self._m = native

    @property
    def model_type(self) -> str:
        """config.json's model_type: "vit", "deit", "resnet", "convnext"."""
        return self._m.model_type

    @property
    def architecture(self) -> str:
        """transformers' class: "ResNetForImageClassification", ..."""
        return self._m.architecture

    @property
    def num_labels(self) -> int:
        return self._m.num_labels

    @property
    def causal_lm(self) -> bool:
        """A language model (GPT-2): token ids in, next-token logits out."""
        return self._m.causal_lm

    @property
    def num_logits(self) -> int:
        """The logits per example (a language model's: per token, its vocabulary)."""
        return self._m.num_logits

    @property
    def labels(self) -> list:
        """id2label's names, one per label."""
        return self._m.label_names()

    @property
    def num_channels(self) -> int:
        return self._m.num_channels

    @property
    def image_size(self) -> Any:
        """The image size its config names (convolutional models take any)."""
        return self._m.image_size

    @property
    def config(self) -> dict:
        """config.json as save_pretrained writes it."""
        return _json.loads(self._m.config_json())

    def parameter_shapes(self) -> dict:
        return {name: tuple(shape) for name, shape in self._m.parameter_shapes()}

    def state_shapes(self) -> dict:
        return {name: tuple(shape) for name, shape in self._m.state_shapes()}

    def init(self, key: Key, device: Any = None) -> dict:
        """transformers' initialization of the parameters, drawn on ``device``."""
        return self._m.init(key, _device(device) or Device("cpu"))

    def init_state(self, device: Any = None) -> dict:
        """The state of a fresh model (running means 0, variances 1)."""
        return self._m.init_state(_device(device) or Device("cpu"))

    def apply(self, params: dict, state: dict, pixel_values: Any, *, train: bool = False,
              key: Any = None, layout: str = "NCHW", precision: str = "fp32",
              inference: bool = False) -> tuple:
        """(logits [B, num_labels], new state) of pixel_values [B, C, H, W]
        (or [B, H, W, C] with layout="NHWC"); a language model's (logits
        [B, T, vocab], state) of input_ids [B, T]. ``train``: BatchNorm by the
        batch's statistics (the running ones updated), dropout and drop path
        drawn from ``key`` (a Key, or its kiln.random.key_data array inside
        jit)."""
        logits, new_state = self._m.apply(params, state or {}, asarray(pixel_values),
                                          getattr(Layout, layout), train, _key_operand(key),
                                          _precision_dtype(precision), inference)
        return logits, new_state

    __call__ = apply

    def loss(self, logits: Array, labels: Any, label_smoothing: float = 0.0) -> Array:
        """The mean loss transformers computes for the config's problem type
        (softmax cross-entropy for integer labels); a language model's
        next-token cross-entropy (labels [B, T], shifted inside, -100
        ignored)."""
        return self._m.loss(logits, asarray(labels), float(label_smoothing))

    def with_labels(self, labels: Sequence[str]) -> "Model":
        """The same model with a classifier for these labels (a head swap)."""
        return Model(self._m.with_labels(list(labels)))

    def layer_decay_scales(self, decay: float) -> dict:
        """{parameter: learning-rate scale} of layer-wise decay (BEiT's, as
        timm's param_groups_layer_decay groups the model): decay^k for a
        parameter k groups below the classifier; for the optimizers'
        ``lr_scale``."""
        return self._m.layer_decay_scales(float(decay))

    def head_parameters(self) -> set:
        """The names of the classifier's parameters."""
        return set(self._m.head_parameters())

    def check(self, params: dict, state: dict | None = None) -> None:
        """Raises naming the entry where the trees do not fit the model."""
        self._m.check(params, state or {}, "params")

    def generate(self, params: dict, prompt: Any, max_new_tokens: int = 20, *,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 eos_token_id: int | None = None, pad_token_id: int | None = None,
                 precision: str = "fp32", compiled: bool = True) -> Array:
        """A language model's continuation of ``prompt`` (token ids [B, P] or
        one list of ids), as transformers' generate: [B, P + n]. Greedy with
        ``temperature`` 0, else sampled from softmax(logits / temperature)
        narrowed to ``top_k`` and ``top_p`` (draws from ``seed``: the same
        tokens compiled and eagerly). Stops at ``eos_token_id`` (default: the
        config's; -1: never), padding finished rows with ``pad_token_id``
        (default: eos). The prompt runs once, each new token against a KV
        cache, in one compiled program (``compiled=False``: eagerly)."""
        ids = _np.asarray(prompt)
        if ids.ndim == 1:
            ids = ids[None, :]
        if eos_token_id is None:
            eos = self.config.get("eos_token_id")
            eos_token_id = -1 if eos is None else int(eos)
        if pad_token_id is None:
            pad_token_id = eos_token_id if eos_token_id >= 0 else 0
        return _kiln._generate(self._m, params, asarray(ids.astype(_np.int32)),
                               int(max_new_tokens), float(temperature), int(top_k), float(top_p),
                               int(seed), int(eos_token_id), int(pad_token_id),
                               _precision_dtype(precision), bool(compiled))

    def inference_params(self, params: dict, precision: str = "bf16") -> dict:
        """A language model's parameters for :meth:`generate` at ``precision``
        with each matmul weight rounded once (as transformers'
        ``model.to(torch.bfloat16)``; embeddings, norms and biases kept), so
        that repeated calls do not round them again; the tokens are the same.
        "fp32": the parameters as they are."""
        return _kiln._inference_params(self._m, params, _precision_dtype(precision))

    def save_pretrained(self, directory: str, params: dict, state: dict | None = None) -> None:
        """Writes config.json and model.safetensors (parameters and state) for
        transformers' AutoModelForImageClassification.from_pretrained
        (AutoModelForCausalLM for a language model)."""
        _kiln._save_model(_os.fspath(directory), self._m, params, state or {})

    def __repr__(self) -> str:
        return f"kiln.models.Model({self.architecture}, {self.num_labels} labels)"


class Pretrained(NamedTuple):
    """What :func:`from_pretrained` returns."""
    model: Model
    params: dict
    state: dict


def from_config(config: Any) -> Model:
    """The model of a config.json (a path, or the config as a dict) by its
    model_type; another type is an error naming the types kiln has."""
    if isinstance(config, dict):
        return Model(_kiln._model_from_config(_json.dumps(config), "config"))
    path = _os.fspath(config)
    with open(path, encoding="utf-8") as f:
        return Model(_kiln._model_from_config(f.read(), path))


def from_preset(name: str) -> Model:
    """A preset of any family: "vit-base", "deit-small", "resnet-50",
    "convnext-tiny", ... (:func:`presets`)."""
    return Model(_kiln._model_from_preset(name))


def from_pretrained(src: str, labels: Sequence[str] | None = None,
                    key: Key | None = None) -> Pretrained:
    """A pretrained model of any family, as AutoModelForImageClassification
    loads it: a folder that transformers saved, or a Hub id (the local
    cache, else a download). With ``labels``, a new classifier for them
    (drawn from ``key``) where the model's differ."""
    native, params, state, _, _, _ = _kiln._load_model(
        _os.fspath(src), list(labels) if labels is not None else None,
        key if key is not None else Key(0))
    return Pretrained(Model(native), params, state)


def model_folder(src: str) -> str:
    """The folder of a pretrained model: ``src`` itself, or the snapshot of a
    Hub id in the local cache (where its tokenizer files are too)."""
    return _kiln._model_folder(_os.fspath(src))


def model_types() -> list:
    """The model types kiln has."""
    return _kiln._model_types()


def presets() -> list:
    """Every family's presets."""
    return _kiln._model_presets()
