#!/usr/bin/env python3
"""Writes resampled.safetensors beside the DeiT fixtures' weights
(tests/fixtures/deit_golden/deit and deit_with_teacher, made by
make_deit_golden.py): what transformers' DeiTEmbeddings.interpolate_pos_encoding
(the class and distillation embeddings kept, the 4x4 grid by torch's bicubic,
align_corners=False) makes of the position embeddings at other image sizes,
and the logits there (eval mode, interpolate_pos_encoding=True), which
tests/io/pretrained_families_test.cpp checks `--image-size` against.

    bash tools/golden/setup_venv.sh
    tools/golden/.venv/bin/python tools/golden/make_deit_resample_golden.py tests/fixtures/deit_golden
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import DeiTForImageClassification, DeiTForImageClassificationWithTeacher

# (height, width) in pixels; the fixtures' patches are 8 pixels.
RESOLUTIONS = [(48, 48), (24, 40), (16, 16)]


def main(out):
    torch.manual_seed(1)
    for name, cls in (("deit", DeiTForImageClassification),
                      ("deit_with_teacher", DeiTForImageClassificationWithTeacher)):
        d = os.path.join(out, name)
        model = cls.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
        emb = model.deit.embeddings
        hidden = emb.position_embeddings.shape[-1]
        tensors = {}
        with torch.no_grad():
            for h, w in RESOLUTIONS:
                key = f"{h}x{w}"
                n = (h // 8) * (w // 8)
                tensors[f"position_embeddings_{key}"] = emb.interpolate_pos_encoding(
                    torch.zeros(1, 2 + n, hidden), h, w).contiguous()
                pixels = torch.randn(2, 3, h, w)
                tensors[f"pixel_values_{key}"] = pixels
                tensors[f"logits_{key}"] = model(pixel_values=pixels,
                                                 interpolate_pos_encoding=True).logits.contiguous()
        save_file(tensors, os.path.join(d, "resampled.safetensors"),
                  metadata={"torch": torch.__version__,
                            "transformers": __import__("transformers").__version__})
        print(name, "resampled.safetensors")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/deit_golden")
