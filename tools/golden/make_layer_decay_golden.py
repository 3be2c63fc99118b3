"""Golden fixture for --layer-decay: the learning-rate scale timm's
param_groups_layer_decay (BEiT's layer-wise decay, as timm's train.py
applies it with --layer-decay) gives each parameter of a small ViT, ConvNeXt
and ResNet, by timm's parameter names. tests/train/layer_decay_test.cpp maps
kiln's (transformers') names onto these.

    pip install --target DIR --no-deps timm torchvision pillow pyyaml huggingface_hub safetensors
    PYTHONPATH=DIR .venv/bin/python tools/golden/make_layer_decay_golden.py tests/fixtures/layer_decay.json
"""
import json
import sys

import timm
from timm.models.convnext import ConvNeXt
from timm.models.resnet import BasicBlock, ResNet
from timm.models.vision_transformer import VisionTransformer
from timm.optim._param_groups import param_groups_layer_decay

DECAY = 0.7


def scales(model):
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for g in param_groups_layer_decay(model, weight_decay=0.05, layer_decay=DECAY):
        for p in g["params"]:
            out[names[id(p)]] = g["lr_scale"]
    return out


models = {
    "vit": VisionTransformer(img_size=32, patch_size=8, embed_dim=16, depth=3, num_heads=2,
                             num_classes=5),
    "convnext": ConvNeXt(depths=(1, 2, 1, 1), dims=(8, 16, 24, 32), num_classes=5),
    "resnet": ResNet(block=BasicBlock, layers=[2, 1, 1, 1], num_classes=5),
}
fixture = {"timm": timm.__version__, "layer_decay": DECAY,
           "scales": {k: scales(m) for k, m in models.items()}}
with open(sys.argv[1], "w") as f:
    json.dump(fixture, f, indent=1, sort_keys=True)
    f.write("\n")
