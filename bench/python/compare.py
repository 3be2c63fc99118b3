#!/usr/bin/env python3
"""kiln from Python beside kiln's command line, and Python's per-op eager
dispatch beside PyTorch's and JAX's, on this machine, in one run.

1. The reference experiment's step on the same model, mode and batch:
   `kiln train` (the CLI) and examples/reference_experiment.py (the Python
   package), each from a fresh process, alternating, `--repeats` times; the
   step time is each run's "average step time" (the mean over the steps
   after the warm-up, a step timed from fetching its batch until its loss
   exists, in both).
2. bench/python/dispatch.py in the project's .venv (kiln, numpy) and in the
   peers' venv (PyTorch, JAX), one after the other.

    .venv/bin/python bench/python/compare.py --model vit-tiny --out bench/results/DATE-python
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
import benchutil  # noqa: E402

PEERS_PY = os.path.join(ROOT, "bench", "peers", ".venv-gpu-machine", "bin", "python")


def average_step(cmd, env=None):
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"average step time: ([0-9.eE+-]+)", out).group(1)), out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="vit-tiny")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=52)
    p.add_argument("--warmup", type=int, default=11)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", nargs="+", default=["jax", "pytorch"])
    p.add_argument("--out", required=True)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "build", "python"))
    results = {"cpu": benchutil.cpu_model(), "command": " ".join(sys.argv), "steps": {},
               "dispatch": {}}
    for mode in a.modes:
        layout = "nhwc" if mode == "jax" else "nchw"
        common = ["--mode", mode, "--model", a.model, "--batch-size", str(a.batch_size),
                  "--steps", str(a.steps), "--warmup", str(a.warmup)]
        cli = [os.path.join(ROOT, "build", "kiln"), "train", *common, "--layout", layout]
        py = [sys.executable, os.path.join(ROOT, "examples", "reference_experiment.py"), *common]
        runs = {"cli": [], "python": []}
        for r in range(a.repeats):
            order = [("cli", cli), ("python", py)] if r % 2 == 0 else [("python", py), ("cli", cli)]
            for name, cmd in order:
                t, _ = average_step(cmd, env)
                runs[name].append(t)
                print(f"{mode} {name} run {r + 1}: {t:.4f} s", flush=True)
        cli_m, py_m = statistics.median(runs["cli"]), statistics.median(runs["python"])
        results["steps"][mode] = {"cli_s": runs["cli"], "python_s": runs["python"],
                                  "cli_median_s": cli_m, "python_median_s": py_m,
                                  "python_vs_cli": py_m / cli_m - 1}
        print(f"{mode}: python {py_m:.4f} s vs cli {cli_m:.4f} s ({(py_m / cli_m - 1) * 100:+.2f}%)")
    dispatch = os.path.join(HERE, "dispatch.py")
    results["dispatch"]["kiln_venv"] = json.loads(subprocess.run(
        [sys.executable, dispatch], env=env, capture_output=True, text=True, check=True).stdout)
    if os.path.exists(PEERS_PY):
        results["dispatch"]["peers_venv"] = json.loads(subprocess.run(
            [PEERS_PY, dispatch], capture_output=True, text=True, check=True).stdout)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results["dispatch"], indent=1))


if __name__ == "__main__":
    main()
