#!/usr/bin/env bash
# One full call on the lent H200: build the extension with the machine's torch,
# run the main command and the benchmark suite (bench args as given); logs and
# results go to $OUT (at most 8 files come back).
#   usage: bash scripts/gpu_run.sh [bench args...]
set -uo pipefail
export PYTHONUNBUFFERED=1 MAX_JOBS=16
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch, sys; print(sys.version, torch.__version__, torch.version.cuda)'
  python3 -m pip install --no-build-isolation -e . -v > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  python3 -m flash_attn_t --seqlen 512
} > "$OUT/setup.log" 2>&1
tail -20 "$OUT/setup.log"
python3 benchmarks/bench.py --device cuda --out "$OUT/res" "$@" 2>&1 | tee "$OUT/bench.log" | tail -60
