#!/usr/bin/env python3
"""Runs the reference experiment's own script (reference_train.py, kept
outside this repository) as written, with two stand-ins where the machine
cannot run it as written, each announced on stderr:

- --device cpu (a machine without a GPU, to rehearse the GPU check): the
  script's torch.device('cuda') gives the CPU;
- transformers 5 ships no FlaxViTForImageClassification (its jax mode's
  model): bench/peers/flax_vit.py stands in, built from the same ViTConfig,
  returning an object with .logits as transformers' Flax model did.

- --model vit-tiny|vit-small (a smaller ViT than the script's default
  ViTConfig(), for a CPU): transformers' ViTConfig takes that preset's
  hidden size, heads and MLP size unless the script gives them (kiln's
  presets of the same names).

Everything else (data loader, steps, timing formula, printed lines) is the
script's own. Arguments after the runner's own go to the script:

    python3 bench/peers/run_reference.py --script PATH [--device cpu] -- --mode pytorch --batch-size 32
"""
import argparse
import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def default_script():
    for path in (os.environ.get("KILN_REFERENCE_SCRIPT", ""),
                 os.path.join(ROOT, "build-gpu", "bundle", "reference", "reference_train.py"),
                 os.path.join(ROOT, "..", "shared", "reference", "reference_train.py")):
        if path and os.path.isfile(path):
            return path
    return ""


def map_cuda_to_cpu():
    """torch.device('cuda...') gives the CPU device; isinstance(x, torch.device) still holds."""
    import torch

    real = torch.device

    class _Meta(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, real)

    class _Device(metaclass=_Meta):
        def __new__(cls, *args, **kwargs):
            if args and isinstance(args[0], str) and args[0].startswith("cuda"):
                return real("cpu")
            return real(*args, **kwargs)

    torch.device = _Device
    print("run_reference: --device cpu: the script's torch.device('cuda') is the CPU", file=sys.stderr)


def provide_flax_vit():
    """transformers.FlaxViTForImageClassification, where transformers no longer has it."""
    try:
        import transformers
        transformers.FlaxViTForImageClassification  # noqa: B018
        return
    except ImportError:
        return  # no transformers at all: the script says so itself
    except AttributeError:
        pass
    sys.path.insert(0, HERE)
    import flax_vit

    class _Output:
        def __init__(self, logits):
            self.logits = logits

    class _Module(flax_vit.ViTForImageClassification):
        def __call__(self, pixels_nhwc):
            return _Output(super().__call__(pixels_nhwc))

    class FlaxViTForImageClassification:
        """The .module of transformers 4's Flax ViT, from a ViTConfig."""

        def __init__(self, config):
            self.config = config
            self.module = _Module(hidden_size=config.hidden_size, num_hidden_layers=config.num_hidden_layers,
                                  num_attention_heads=config.num_attention_heads,
                                  intermediate_size=config.intermediate_size, num_labels=config.num_labels,
                                  patch_size=config.patch_size, layer_norm_eps=config.layer_norm_eps)

    transformers.FlaxViTForImageClassification = FlaxViTForImageClassification
    print(f"run_reference: transformers {transformers.__version__} has no FlaxViTForImageClassification: "
          "bench/peers/flax_vit.py stands in", file=sys.stderr)


# kiln's presets (src/nn/vit.cpp): 12 layers, patch 16, 224x224 as ViTConfig()'s.
PRESETS = {"vit-tiny": dict(hidden_size=192, num_attention_heads=3, intermediate_size=768),
           "vit-small": dict(hidden_size=384, num_attention_heads=6, intermediate_size=1536)}


def shrink_model(name):
    """transformers.ViTConfig() with preset `name`'s sizes where not given."""
    import transformers

    real, sizes = transformers.ViTConfig, PRESETS[name]

    class ViTConfig(real):
        def __init__(self, **kwargs):
            for k, v in sizes.items():
                kwargs.setdefault(k, v)
            super().__init__(**kwargs)

    transformers.ViTConfig = ViTConfig
    print(f"run_reference: --model {name}: transformers' ViTConfig() takes {sizes}", file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--script", default=default_script(), help="reference_train.py (default: "
                   "$KILN_REFERENCE_SCRIPT, the GPU bundle's copy, or ../shared/reference/)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--model", default=None, choices=sorted(PRESETS),
                   help="a smaller ViT than the script's ViTConfig() (default: the script's own)")
    args, rest = p.parse_known_args()
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if not args.script or not os.path.isfile(args.script):
        sys.exit(f"run_reference: the reference script '{args.script}' does not exist "
                 "(--script, or KILN_REFERENCE_SCRIPT)")
    if args.device == "cpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        map_cuda_to_cpu()
    provide_flax_vit()  # the script imports jax, flax and transformers at its top anyway
    if args.model:
        shrink_model(args.model)
    sys.argv = [args.script, *rest]
    runpy.run_path(args.script, run_name="__main__")


if __name__ == "__main__":
    main()
