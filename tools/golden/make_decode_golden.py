#!/usr/bin/env python3
"""Writes the fixtures that tests/data/decode_test.cpp checks kiln's image
decoding and preprocessing against, bit for bit:

- OUT/images/: small JPEGs (Pillow's encoder: 4:4:4, 4:2:2, 4:2:0 at odd
  sizes, progressive, grey, CMYK, RGB without YCbCr, EXIF orientations 1-8,
  an XMP orientation) and PNGs (written here chunk by chunk so that every
  colour type and bit depth occurs: grey 1/2/4/8/16, grey+alpha 8/16, RGB
  8/16, RGBA 8/16, palette 1/2/4/8 with tRNS and with a short palette,
  Adam7 interlacing, tRNS on RGB, gAMA, eXIf before and after the image
  data, an XMP orientation);
- OUT/processors/<name>/preprocessor_config.json: ViTImageProcessor settings;
- OUT/expected.safetensors: for image i (`file.i`, the name's bytes as I32),
  what transformers' load_image gives (`rgb.i`: ImageOps.exif_transpose,
  then convert("RGB"); I32 [height, width, 3]) and `l.i` (the same, then
  convert("L") from the transposed image); for each processor p and image i,
  `pixel_values.p.i` (F32 [3, height, width]) from ViTImageProcessorPil, and
  `processor.p` (its folder's name).

    bench/peers/.venv-gpu-machine/bin/python tools/golden/make_decode_golden.py tests/fixtures/decode
"""
import io
import json
import os
import struct
import sys
import zlib

import numpy as np
import PIL
import transformers
from PIL import Image, ImageOps
from safetensors.numpy import save_file
from transformers.image_utils import load_image
from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil


def photo(w, h, seed):
    """A smooth picture with some texture: what JPEG is made for."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    r = 128 + 100 * np.sin(x / 3.0 + seed) * np.cos(y / 4.0)
    g = 255 * x / max(w - 1, 1)
    b = 255 * y / max(h - 1, 1)
    a = np.stack([r, g, b], -1) + rng.normal(0, 12, (h, w, 3))
    return np.clip(a, 0, 255).astype(np.uint8)


def jpegs():
    out = {}
    rgb = Image.fromarray(photo(37, 23, 1))
    for sub in (0, 1, 2):
        b = io.BytesIO()
        rgb.save(b, "JPEG", quality=90, subsampling=sub)
        out[f"jpeg_sub{sub}.jpg"] = b.getvalue()
    b = io.BytesIO()
    rgb.save(b, "JPEG", quality=85, progressive=True)
    out["jpeg_progressive.jpg"] = b.getvalue()
    b = io.BytesIO()
    rgb.convert("L").save(b, "JPEG", quality=90)
    out["jpeg_grey.jpg"] = b.getvalue()
    b = io.BytesIO()
    rgb.convert("CMYK").save(b, "JPEG", quality=95)
    out["jpeg_cmyk.jpg"] = b.getvalue()
    b = io.BytesIO()
    rgb.save(b, "JPEG", quality=90, keep_rgb=True)
    out["jpeg_rgb_no_ycbcr.jpg"] = b.getvalue()
    small = Image.fromarray(photo(19, 11, 2))
    for o in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = o
        b = io.BytesIO()
        small.save(b, "JPEG", quality=90, exif=exif)
        out[f"jpeg_exif{o}.jpg"] = b.getvalue()
    xmp = (b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
           b'<rdf:Description xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="6"/></rdf:RDF></x:xmpmeta>')
    b = io.BytesIO()
    small.save(b, "JPEG", quality=90, xmp=xmp)
    out["jpeg_xmp6.jpg"] = b.getvalue()
    return out


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def pack_rows(a, bits):
    """Rows of samples (uint16 values) packed big-endian at `bits` per sample, a filter byte each."""
    rows = []
    for row in a:
        flat = row.reshape(-1).astype(np.uint32)
        if bits == 16:
            data = flat.astype(">u2").tobytes()
        elif bits == 8:
            data = flat.astype(np.uint8).tobytes()
        else:
            per = 8 // bits
            padded = np.concatenate([flat, np.zeros((-len(flat)) % per, np.uint32)])
            by = np.zeros(len(padded) // per, np.uint32)
            for k in range(per):
                by |= padded[k::per] << (8 - bits * (k + 1))
            data = by.astype(np.uint8).tobytes()
        rows.append(b"\x00" + data)
    return b"".join(rows)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def png(a, color_type, bits, palette=None, trns=None, interlace=False, before=(), after=()):
    """A PNG of samples `a` ([h, w, channels], integers) as written by hand."""
    h, w = a.shape[:2]
    if interlace:
        raw = b""
        for x0, y0, dx, dy in ADAM7:
            sub = a[y0::dy, x0::dx]
            if sub.size:
                raw += pack_rows(sub, bits)
    else:
        raw = pack_rows(a, bits)
    s = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bits, color_type, 0, 0, int(interlace)))
    for c in before:
        s += c
    if palette is not None:
        s += chunk(b"PLTE", np.asarray(palette, np.uint8).tobytes())
    if trns is not None:
        s += chunk(b"tRNS", trns)
    s += chunk(b"IDAT", zlib.compress(raw, 9))
    for c in after:
        s += c
    return s + chunk(b"IEND", b"")


def exif_tiff(orientation):
    # A little-endian TIFF header and one IFD holding Orientation (SHORT).
    return b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1) + struct.pack("<HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack("<I", 0)


def pngs():
    rng = np.random.default_rng(7)
    h, w = 11, 13
    out = {}
    for bits in (1, 2, 4, 8):
        out[f"png_grey{bits}.png"] = png(rng.integers(0, 1 << bits, (h, w, 1)), 0, bits)
    g16 = rng.integers(0, 1 << 16, (h, w, 1))
    g16[::2] = rng.integers(0, 300, (h // 2 + 1, w, 1))  # some rows below 256, where convert() keeps the value
    out["png_grey16.png"] = png(g16, 0, 16)
    out["png_greyalpha8.png"] = png(rng.integers(0, 256, (h, w, 2)), 4, 8)
    out["png_greyalpha16.png"] = png(rng.integers(0, 1 << 16, (h, w, 2)), 4, 16)
    out["png_rgb8.png"] = png(rng.integers(0, 256, (h, w, 3)), 2, 8)
    out["png_rgb16.png"] = png(rng.integers(0, 1 << 16, (h, w, 3)), 2, 16)
    out["png_rgba8.png"] = png(rng.integers(0, 256, (h, w, 4)), 6, 8)
    out["png_rgba16.png"] = png(rng.integers(0, 1 << 16, (h, w, 4)), 6, 16)
    for bits in (1, 2, 4, 8):
        n = 1 << bits
        pal = rng.integers(0, 256, (n, 3))
        out[f"png_palette{bits}.png"] = png(rng.integers(0, n, (h, w, 1)), 3, bits, palette=pal)
    pal = rng.integers(0, 256, (16, 3))
    out["png_palette_trns.png"] = png(rng.integers(0, 16, (h, w, 1)), 3, 4, palette=pal,
                                      trns=bytes(rng.integers(0, 256, 16).astype(np.uint8)))
    out["png_palette_short.png"] = png(rng.integers(0, 16, (h, w, 1)), 3, 8, palette=rng.integers(0, 256, (5, 3)))
    out["png_interlaced_rgb.png"] = png(rng.integers(0, 256, (h, w, 3)), 2, 8, interlace=True)
    out["png_interlaced_grey4.png"] = png(rng.integers(0, 16, (h, w, 1)), 0, 4, interlace=True)
    out["png_rgb_trns.png"] = png(rng.integers(0, 256, (h, w, 3)), 2, 8, trns=struct.pack(">HHH", 1, 2, 3))
    out["png_gamma.png"] = png(rng.integers(0, 256, (h, w, 3)), 2, 8, before=[chunk(b"gAMA", struct.pack(">I", 100000))])
    out["png_exif6.png"] = png(rng.integers(0, 256, (h, w, 3)), 2, 8, before=[chunk(b"eXIf", exif_tiff(6))])
    out["png_exif3_after.png"] = png(rng.integers(0, 256, (h, w, 3)), 2, 8, after=[chunk(b"eXIf", exif_tiff(3))])
    xmp = b'<x:xmpmeta><rdf:Description tiff:Orientation="8"/></x:xmpmeta>'
    out["png_xmp8.png"] = png(rng.integers(0, 256, (h, w, 3)), 2, 8,
                              before=[chunk(b"iTXt", b"XML:com.adobe.xmp\x00\x00\x00\x00\x00" + xmp)])
    return out


PROCESSORS = {
    # transformers' defaults for ViTImageProcessor (the file is empty but for its type)
    "defaults": {"image_processor_type": "ViTImageProcessor"},
    # as google/vit-base-patch16-224 ships it: 4.x names, size as an integer
    "vit_base_224": {"do_normalize": True, "do_resize": True, "feature_extractor_type": "ViTFeatureExtractor",
                     "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 2, "size": 224},
    "bicubic_odd": {"image_processor_type": "ViTImageProcessor", "do_resize": True,
                    "size": {"height": 29, "width": 17}, "resample": 3, "do_rescale": True,
                    "rescale_factor": 0.00392156862745098, "do_normalize": True,
                    "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]},
    "shortest_edge_crop": {"image_processor_type": "ViTImageProcessor", "do_resize": True,
                           "size": {"shortest_edge": 20}, "resample": 1, "do_center_crop": True,
                           "crop_size": {"height": 16, "width": 18}, "do_normalize": True,
                           "image_mean": [0.5, 0.4, 0.3], "image_std": [0.2, 0.3, 0.4]},
    "no_resize_no_normalize": {"image_processor_type": "ViTImageProcessor", "do_resize": False,
                               "do_rescale": True, "rescale_factor": 0.0078125, "do_normalize": False},
    "box_no_rescale": {"image_processor_type": "ViTImageProcessor", "size": {"height": 8, "width": 12},
                       "resample": 4, "do_rescale": False, "image_mean": [100, 110, 120],
                       "image_std": [50, 60, 70]},
    "nearest_hamming": {"image_processor_type": "ViTImageProcessor", "size": {"height": 40, "width": 31},
                        "resample": 0},
}
PROCESSED = ["jpeg_sub2.jpg", "jpeg_exif6.jpg", "png_grey16.png", "png_rgba8.png", "jpeg_cmyk.jpg"]
# 224 x 224 outputs are large: one image each ("vit_base_224" computes what "defaults" does).
PROCESSED_224 = {"defaults": ["jpeg_exif6.jpg"], "vit_base_224": []}


def main(out):
    os.makedirs(f"{out}/images", exist_ok=True)
    files = {**jpegs(), **pngs()}
    tensors = {}
    names = sorted(files)
    for i, name in enumerate(names):
        path = f"{out}/images/{name}"
        with open(path, "wb") as f:
            f.write(files[name])
        img = ImageOps.exif_transpose(Image.open(path))
        tensors[f"file.{i}"] = np.frombuffer(name.encode(), np.uint8).astype(np.int32)
        tensors[f"rgb.{i}"] = np.asarray(img.convert("RGB")).astype(np.int32)
        tensors[f"l.{i}"] = np.asarray(img.convert("L")).astype(np.int32)[:, :, None]
        assert np.array_equal(np.asarray(load_image(path)), tensors[f"rgb.{i}"]), name
    for p, (pname, cfg) in enumerate(sorted(PROCESSORS.items())):
        d = f"{out}/processors/{pname}"
        os.makedirs(d, exist_ok=True)
        with open(f"{d}/preprocessor_config.json", "w") as f:
            json.dump(cfg, f, indent=2)
        proc = ViTImageProcessorPil.from_pretrained(d)
        tensors[f"processor.{p}"] = np.frombuffer(pname.encode(), np.uint8).astype(np.int32)
        for name in PROCESSED_224.get(pname, PROCESSED):
            i = names.index(name)
            pv = proc(images=load_image(f"{out}/images/{name}"), return_tensors="np")["pixel_values"][0]
            tensors[f"pixel_values.{p}.{i}"] = np.ascontiguousarray(pv.astype(np.float32))
    save_file(tensors, f"{out}/expected.safetensors",
              metadata={"pillow": PIL.__version__, "transformers": transformers.__version__})
    print(f"{len(names)} images, {len(PROCESSORS)} processors; Pillow {PIL.__version__}, "
          f"transformers {transformers.__version__}")


if __name__ == "__main__":
    main(sys.argv[1])
