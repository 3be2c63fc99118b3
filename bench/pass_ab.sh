#!/usr/bin/env bash
# A/B of one compiler pass: `kiln train --mode jit` with and without
# KILN_COMPILE=SWITCH (no_epilogue, no_reduce, ...), alternating, ROUNDS times
# each, at batch 32 (f32).
#   bash bench/pass_ab.sh OUT_DIR [model] [rounds] [switch]
# Writes OUT_DIR/<model>-{on,off}-<round>.jsonl and OUT_DIR/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bench/pass_ab.sh OUT_DIR [model] [rounds] [switch]}"
switch="${4:-no_epilogue}"
exec bash bench/ab.sh "$out" "${2:-vit-small}" "${3:-3}" jit on "" off "KILN_COMPILE=$switch"
