#!/usr/bin/env python3
"""Checks that transformers and huggingface_hub find kiln's Hub downloads
offline, and kiln theirs: serves a small Hub on 127.0.0.1 (the same protocol
as tests/io/hub_test.cpp's: X-Repo-Commit, ETags, LFS files behind a
redirect), lets `kiln predict` download a model from it into an empty cache,
then loads that cache with HF_HUB_OFFLINE=1 through huggingface_hub's
hf_hub_download and transformers' from_pretrained, and compares the logits;
then has huggingface_hub download a second model from the same server and
kiln read it offline.

    bench/peers/.venv-gpu-machine/bin/python tools/golden/check_hub_cache.py build/kiln
"""
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import numpy as np
import torch
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "predict", "single")
COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
FILES = {name: open(os.path.join(FIXTURE, name), "rb").read()
         for name in ("config.json", "model.safetensors", "preprocessor_config.json")}
REPOS = {"org/kiln-got-it": FILES, "org/hf-got-it": FILES}


def git_sha1(b):
    return hashlib.sha1(b"blob %d\0" % len(b) + b).hexdigest()


class Hub(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, body):
        parts = self.path.split("/")
        if self.path.startswith("/cdn/"):
            sha = parts[2]
            data = next(b for f in REPOS.values() for b in f.values() if hashlib.sha256(b).hexdigest() == sha)
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)
            return
        repo, name = "/".join(parts[1:3]), "/".join(parts[5:])
        data = REPOS.get(repo, {}).get(name)
        if data is None:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if name.endswith(".safetensors"):
            sha = hashlib.sha256(data).hexdigest()
            self.send_response(302)
            # Another host, as the Hub's CDN (a redirect on the same host is a moved repository).
            self.send_header("Location", f"http://localhost:{self.server.server_port}/cdn/{sha}")
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("ETag", f'"{git_sha1(b"pointer")}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{git_sha1(data)}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_HEAD(self):
        self.reply(False)

    def do_GET(self):
        self.reply(True)


def main(kiln):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cache = tempfile.mkdtemp(prefix="kiln-hub-cache-")
    env = dict(os.environ, HF_ENDPOINT=f"http://127.0.0.1:{server.server_port}", HF_HUB_CACHE=cache)
    env.pop("HF_HUB_OFFLINE", None)
    image = os.path.join(cache, "image.png")
    Image.fromarray((np.arange(24 * 24 * 3) % 251).astype(np.uint8).reshape(24, 24, 3)).save(image)

    # 1. kiln downloads; huggingface_hub and transformers read its cache offline.
    out = subprocess.run([kiln, "predict", "--model", "org/kiln-got-it", "--json", image], env=env,
                         capture_output=True, text=True, check=True)
    kiln_scores = json.loads(out.stdout)["predictions"]
    os.environ.update(HF_HUB_CACHE=cache, HF_HUB_OFFLINE="1", HF_ENDPOINT=env["HF_ENDPOINT"])
    from huggingface_hub import hf_hub_download
    from transformers import ViTForImageClassification, pipeline
    from transformers.models.vit.image_processing_pil_vit import ViTImageProcessorPil
    path = hf_hub_download("org/kiln-got-it", "model.safetensors")
    assert os.path.realpath(path).endswith(hashlib.sha256(FILES["model.safetensors"]).hexdigest()), path
    model = ViTForImageClassification.from_pretrained("org/kiln-got-it")
    pipe = pipeline("image-classification", model=model,
                    image_processor=ViTImageProcessorPil.from_pretrained("org/kiln-got-it"), device="cpu")
    hf_scores = pipe(image, top_k=5)
    worst = max(abs(a["score"] - b["score"]) for a, b in zip(kiln_scores, hf_scores))
    assert [a["label"] for a in kiln_scores] == [b["label"] for b in hf_scores], (kiln_scores, hf_scores)
    print(f"transformers read kiln's download offline: same labels, scores within {worst:.2e}")

    # 2. huggingface_hub downloads; kiln reads its cache offline.
    os.environ.pop("HF_HUB_OFFLINE")
    import huggingface_hub.constants as c
    c.HF_HUB_OFFLINE = False
    for name in FILES:  # hf_hub_download, file by file (snapshot_download asks the API for a listing)
        hf_hub_download("org/hf-got-it", name, cache_dir=cache)
    env["HF_HUB_OFFLINE"] = "1"
    out = subprocess.run([kiln, "predict", "--model", "org/hf-got-it", "--json", image], env=env,
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["predictions"][0]["label"] == kiln_scores[0]["label"]
    print("kiln read huggingface_hub's download offline:", out.stderr.strip().splitlines()[-1])
    server.shutdown()
    shutil.rmtree(cache)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "kiln"))
