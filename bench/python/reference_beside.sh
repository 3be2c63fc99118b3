#!/usr/bin/env bash
# examples/reference_experiment.py (kiln from Python) beside the reference
# experiment's own script on this machine's CPU, vit-tiny, batch 32, each of
# the three modes, one after the other: their outputs as printed, into
# OUT/outputs.txt. The reference script runs through bench/peers/run_reference.py
# (--device cpu, --model vit-tiny: its stand-ins, announced on stderr) in
# the peers' venv (bench/peers/setup_venv.sh --gpu-machine); a mode it cannot
# run here (torch_xla: not installed) is recorded with its error.
#
#   bash bench/python/reference_beside.sh bench/results/DATE-python
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: reference_beside.sh OUT_DIR}
mkdir -p "$out"
log="$out/outputs.txt"
peers=bench/peers/.venv-gpu-machine/bin/python
{
  echo "# $(date -u +%Y-%m-%d) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
  for mode in pytorch torch_xla jax; do
    echo
    echo "== the reference script (run_reference.py --device cpu --model vit-tiny -- --mode $mode)"
    "$peers" bench/peers/run_reference.py --device cpu --model vit-tiny -- --mode "$mode" 2>&1 |
      grep -v "Warning\|warn(" | tail -n 8 || true
    echo "== kiln: examples/reference_experiment.py --mode $mode --model vit-tiny"
    PYTHONPATH=build/python .venv/bin/python examples/reference_experiment.py --mode "$mode" \
      --model vit-tiny 2>&1
  done
} | tee "$log"
