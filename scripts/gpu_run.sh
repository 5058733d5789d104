#!/usr/bin/env bash
# One full call on the lent GPU machine: build the extension with that
# machine's torch, run the main command, then whatever the environment asks:
#   TESTS="pytest args"     e.g. TESTS="-k cuda tests"   (GPU test suite)
#   SM90_CHECK=1            build and run dev/sm90_fwd_check.cu (standalone)
#   SM80_FWD_BENCH=1        build and run dev/sm80_fwd_bench.cu (tile variants)
#   SM80_BWD_BENCH=1        build and run dev/sm80_bwd_bench.cu (tile variants)
#   SEGV_DIAG=1             dev/segv_diag/diag.py (the ValueError crash)
#   NCU=1                   ncu stall/throughput sections of the sm80 forward
#                           (dev bench, D=128, 16k) and backward (profile_bwd.py)
#   SANITIZE=1              compute-sanitizer memcheck/racecheck/synccheck on
#                           scripts/sanitize_small.py
#   BENCH="bench.py args"   e.g. BENCH="--suite fa3 --impl fat-sm80 sdpa-flash2"
#   FLASH_ATTN_T_HEADDIMS / FLASH_ATTN_T_CUDA_ARCHS   restrict the build
# Every step's log goes to $OUT/logs; everything is packed into
# $OUT/results.tgz (few files come back from the machine).
#   usage: TESTS=... BENCH=... bash scripts/gpu_run.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16} SM90_CHECK_ARGS=${SM90_CHECK_ARGS:-}
OUT=${OUT:-/tmp/gpu_out}
LOGS=$OUT/logs
mkdir -p "$LOGS"

step() {
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc, $((SECONDS - t0)) s"
  tail -n "${TAIL:-15}" "$LOGS/$name.log"
  return $rc
}

pack() { tar czf "$OUT/results.tgz" -C "$OUT" logs $( [ -d "$OUT/res" ] && echo res ); }
trap pack EXIT

step env bash -c 'nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv;
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)"'
if [ -n "${SM90_CHECK:-}" ]; then
  step sm90_build nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc \
    dev/sm90_fwd_check.cu csrc/fat_common.c -o /tmp/sm90_check &&
    TAIL=60 step sm90_check timeout 120 /tmp/sm90_check $SM90_CHECK_ARGS
fi
if [ -n "${SM80_FWD_BENCH:-}" ]; then
  step sm80_fwd_bench_build nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc \
    dev/sm80_fwd_bench.cu csrc/fat_common.c -o /tmp/sm80_fwd_bench &&
    TAIL=70 step sm80_fwd_bench timeout 120 /tmp/sm80_fwd_bench
fi
if [ -n "${SM80_BWD_BENCH:-}" ]; then
  step sm80_bwd_bench_build nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc \
    dev/sm80_bwd_bench.cu csrc/fat_common.c -o /tmp/sm80_bwd_bench &&
    TAIL=70 step sm80_bwd_bench timeout 120 /tmp/sm80_bwd_bench
fi
step build python3 -m pip install --no-build-isolation -e . -v || exit 1
if [ -n "${SEGV_DIAG:-}" ]; then
  TAIL=40 step segv_diag timeout 200 python3 dev/segv_diag/diag.py
fi
NCU_SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis"
if [ -n "${NCU:-}" ]; then
  [ -x /tmp/sm80_fwd_bench ] && TAIL=3 step ncu_fwd ncu --clock-control none $NCU_SECTIONS \
    -k regex:sm80_fwd_kernel --launch-skip 2 -c 1 /tmp/sm80_fwd_bench 128 16384
  TAIL=3 step ncu_bwd ncu --clock-control none $NCU_SECTIONS -k regex:dkdv -c 1 \
    python3 scripts/profile_bwd.py
fi
grep -E "ptxas info|spill" "$LOGS/build.log" | grep -B1 -E "[1-9][0-9]* bytes spill" | head -20
step main python3 -m flash_attn_t --seqlen 1024
if [ -n "${TESTS:-}" ]; then
  TAIL=40 step tests timeout 300 python3 -m pytest -q -p no:cacheprovider $TESTS
fi
if [ -n "${SANITIZE:-}" ]; then
  for tool in memcheck racecheck synccheck; do
    TAIL=6 step "sanitize_$tool" compute-sanitizer --tool $tool --error-exitcode 3 python3 scripts/sanitize_small.py
  done
fi
if [ -n "${BENCH:-}" ]; then
  TAIL=60 step bench timeout 200 python3 benchmarks/bench.py --device cuda --out "$OUT/res" $BENCH
fi
