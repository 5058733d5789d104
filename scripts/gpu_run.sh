#!/usr/bin/env bash
# One full call on the lent GPU machine: build the extension with that
# machine's torch, run the main command, then whatever the environment asks:
#   TESTS="pytest args"     e.g. TESTS="-k cuda tests"   (GPU test suite; TESTS_TIMEOUT s)
#   SM90_CHECK=1            build and run dev/sm90_fwd_check.cu (standalone; SM90_CHECK_TIMEOUT s)
#   SM90_CHECK_MODES="full thread-store"  one check run per mode (full = no argument;
#                           default: one run with SM90_CHECK_ARGS)
#   SM90_TABLES="64:5 128"  dev check timing tables (head dim[:variant number of its enum];
#                           default sm90_fwd) of the tree's build and of each SM90_AB build,
#                           interleaved per table: logs/sm90_tables.log
#   SM90_AB="ab/base ab/A"  extra dev check builds, each with the files of that folder copied
#                           over csrc/cuda (A/B timings of a kernel change in one call)
#   SM90_TIMELINE="64:2048:1:16"  event timelines of the dev check built with
#                           -DFAT_SM90_TIMELINE (dev/sm90_timeline.cuh), at head dim:seqlen:
#                           causal:variant: logs/timeline_<spec>.txt (scripts/timeline.py reads them)
#   SM80_FWD_BENCH=1        build and run dev/sm80_fwd_bench.cu (tile variants)
#   SM80_BWD_BENCH=1        build and run dev/sm80_bwd_bench.cu (tile variants)
#   SM80_BENCH_SHAPES="128x16384 64x16384"  only these (head dim x seqlen)
#   SM80_BENCH_FILTER="default"  only the bench variants whose name contains it
#                           (forward bench: any of its comma-separated parts)
#   SM80_BENCH_ROUNDS=3     run the shapes' benches that many times over (logs _r2, _r3)
#   NCU=1                   ncu stall/throughput sections of the sm80 forward
#                           (dev bench, D=128, 16k) and backward (profile_bwd.py)
#   NCU_SM90="64x2048 128x8192x0x1"  ncu of the sm90a forward at these shapes: head dim x
#                           seqlen [x causal [x variant number of the check's enum; default sm90_fwd]]
#                           (dev/sm90_fwd_check.cu "one"; pipe utilisation, stall reasons, DRAM bytes,
#                           L2 hits, clock)
#   NCU_BWD="fat:64:16384:0 fa2:64:16384:0"  ncu of the backward's main kernel, flash_attn_t
#                           or torch's FlashAttention-2, at impl:head dim:seqlen:causal
#                           (scripts/profile_bwd.py; pipes, stall reasons, launch stats)
#   NCU_FWD="fat:128:1024:0 fa2:128:1024:0"  the same for the forward kernel (flash_attn_t's
#                           sm80 forward, FLASH_ATTN_T_BACKEND=sm80, or FlashAttention-2's)
#   NCU_SDPA="cudnn:64:2048:1 fat:64:2048:1"  the same for the first attention forward kernel of
#                           flash_attn_t (default path) or torch's SDPA (fa2, cudnn), launch
#                           statistics and occupancy included (which grid, block, registers, smem)
#   NCU_SM90_SOURCE="64x2048x1"  per-instruction warp-state samples (SASS) of the sm90a forward
#                           at the NCU_SM90 shape syntax: logs/ncu_src_<shape>.csv
#   BWD_KERNELS="64:1024:1 128:16384:0"  per-kernel CUDA times of one backward of both
#                           (profile_bwd.py --kernels) at head dim:seqlen:causal
#   SANITIZE=1              compute-sanitizer memcheck/racecheck/synccheck on
#                           scripts/sanitize_small.py
#   TESTS_SM80="pytest args"  the same with FLASH_ATTN_T_BACKEND=sm80 (mma.sync only)
#   BENCH="bench.py args"   e.g. BENCH="--impl fat-sm80 sdpa-flash2"; with
#   BENCH_SUITES="fa3 gqa:90"  run once per suite[:timeout s] (default: BENCH as given)
#   BENCH_PLAN=file         one bench.py run per line "<seconds> <name> <bench.py args>"
#                           (# comments; results under $OUT/res/<name>/ for bench.py --merge)
#   TRAIN="train_llama.py args"   the end-to-end training benchmark (TRAIN_TIMEOUT s)
#   TESTS_LATE="pytest args"  a last test run (slow ones, after the benchmarks)
#   FLASH_ATTN_T_HEADDIMS / FLASH_ATTN_T_CUDA_ARCHS   restrict the build
#   PROBE="fwd_timing_probe.py args"  scripts/fwd_timing_probe.py (PROBE_TIMEOUT s)
#   SKIP_BUILD=1            dev tools only: no extension build, main, tests or benches
#   CLOCK_LOG=1             sample SM clock, power and temperature every 100 ms into
#                           logs/clocks.csv (step start/end times: logs/steps.txt)
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
  echo "$(date +%T.%N) start $name" >> "$LOGS/steps.txt"
  "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "$(date +%T.%N) end $name" >> "$LOGS/steps.txt"
  echo "== $name: rc=$rc, $((SECONDS - t0)) s"
  tail -n "${TAIL:-15}" "$LOGS/$name.log"
  return $rc
}

pack() {
  [ -n "${CLOCK_PID:-}" ] && kill "$CLOCK_PID" 2>/dev/null
  tar czf "$OUT/results.tgz" -C "$OUT" logs $( [ -d "$OUT/res" ] && echo res )
}
trap pack EXIT
if [ -n "${CLOCK_LOG:-}" ]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 100 > "$LOGS/clocks.csv" 2>&1 &
  CLOCK_PID=$!
fi

step env bash -c 'nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv;
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)"'
# The standalone dev tools build (one nvcc process each) beside the extension.
dev_build() {  # name source
  step "$1_build" nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Icsrc \
    "$2" csrc/fat_common.c -o "/tmp/$1"
}
DEV_BUILDS=()  # their pids: the clock logger also runs in the background
[ -n "${SM90_CHECK:-}${NCU_SM90:-}${NCU_SM90_SOURCE:-}${SM90_TABLES:-}" ] && { dev_build sm90_check dev/sm90_fwd_check.cu & DEV_BUILDS+=($!); }
ab_build() {  # folder: csrc with its files over csrc/cuda -> /tmp/sm90_check_<folder name>
  local name root
  name=$(basename "$1"); root=/tmp/ab_$name
  rm -rf "$root"; mkdir -p "$root"; cp -r csrc "$root/"; cp "$1"/* "$root/csrc/cuda/"
  step "sm90_check_${name}_build" nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I"$root/csrc" \
    dev/sm90_fwd_check.cu "$root/csrc/fat_common.c" -o "/tmp/sm90_check_$name"
}
for dir in ${SM90_AB:-}; do ab_build "$dir" & DEV_BUILDS+=($!); done
[ -n "${SM90_TIMELINE:-}" ] && { step sm90_tl_build nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a \
  -Icsrc -Idev -DFAT_SM90_TIMELINE dev/sm90_fwd_check.cu csrc/fat_common.c -o /tmp/sm90_tl & DEV_BUILDS+=($!); }
[ -n "${SM80_FWD_BENCH:-}" ] && { dev_build sm80_fwd_bench dev/sm80_fwd_bench.cu & DEV_BUILDS+=($!); }
[ -n "${SM80_BWD_BENCH:-}" ] && { dev_build sm80_bwd_bench dev/sm80_bwd_bench.cu & DEV_BUILDS+=($!); }
if [ -z "${SKIP_BUILD:-}" ]; then
  step build python3 -m pip install --no-build-isolation -e . -v || exit 1
  # which libstdc++ _C uses (setup.py: a toolchain that links it statically is redirected)
  step libstdcxx bash -c 'grep "links libstdc++" "$0"; ldd flash_attn_t/_C*.so | grep stdc' "$LOGS/build.log"
fi
[ ${#DEV_BUILDS[@]} -gt 0 ] && wait "${DEV_BUILDS[@]}"
# dev/sm80_<pass>_bench: time at each shape ("all" = its grid)
sm80_bench() {
  local pass=$1
  [ -x "/tmp/sm80_${pass}_bench" ] || return
  for round in $(seq 1 "${SM80_BENCH_ROUNDS:-1}"); do  # rounds alternate the variants' timings
    for shape in ${SM80_BENCH_SHAPES:-all}; do  # e.g. "128x16384 64x16384"
      [ "$shape" = all ] && args="0 0" || args="${shape/x/ }"
      TAIL=70 step "sm80_${pass}_bench_$shape$( [ "$round" -gt 1 ] && echo "_r$round")" timeout 120 \
        "/tmp/sm80_${pass}_bench" $args ${SM80_BENCH_FILTER:+"$SM80_BENCH_FILTER"}
    done
  done
}
[ -n "${SM80_FWD_BENCH:-}" ] && sm80_bench fwd
[ -n "${SM80_BWD_BENCH:-}" ] && sm80_bench bwd
if [ -n "${SM90_CHECK:-}" ] && [ -x /tmp/sm90_check ]; then
  if [ -z "${SM90_CHECK_MODES:-}" ]; then
    TAIL=60 step sm90_check timeout ${SM90_CHECK_TIMEOUT:-150} /tmp/sm90_check $SM90_CHECK_ARGS
  else
    for mode in $SM90_CHECK_MODES; do
      [ "$mode" = full ] && args="" || args=$mode
      TAIL=60 step "sm90_check_$mode" timeout ${SM90_CHECK_TIMEOUT:-150} /tmp/sm90_check $args
    done
  fi
fi
sm90_tables() {
  local spec bin dir
  for spec in $SM90_TABLES; do
    for bin in /tmp/sm90_check $(for dir in ${SM90_AB:-}; do echo "/tmp/sm90_check_$(basename "$dir")"; done); do
      echo "### $bin table ${spec/:/ }"
      [ -x "$bin" ] && timeout 60 "$bin" table ${spec/:/ }
    done
  done
}
[ -n "${SM90_TABLES:-}" ] && TAIL=0 step sm90_tables sm90_tables
for spec in ${SM90_TIMELINE:-}; do
  [ -x /tmp/sm90_tl ] && TAIL=2 step "sm90_timeline_${spec//:/x}" timeout 60 /tmp/sm90_tl timeline ${spec//:/ } \
    "$LOGS/timeline_${spec//:/x}.txt"
done
NCU_SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis"
if [ -n "${NCU:-}" ]; then
  [ -x /tmp/sm80_fwd_bench ] && TAIL=3 step ncu_fwd ncu --clock-control none $NCU_SECTIONS \
    -k regex:sm80_fwd_kernel --launch-skip 2 -c 1 /tmp/sm80_fwd_bench 128 16384
  TAIL=3 step ncu_bwd ncu --clock-control none $NCU_SECTIONS -k regex:dkdv -c 1 \
    python3 scripts/profile_bwd.py
fi
PIPE_METRICS="regex:sm__pipe_.*_cycles_active.avg.pct_of_peak_sustained_active,regex:sm__inst_executed_pipe_.*.avg.pct_of_peak_sustained_active"
# cycles per issued instruction that warps spend stalled, by reason
STALL_METRICS="regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio"
for shape in ${NCU_SM90:-}; do
  [ -x /tmp/sm90_check ] && TAIL=3 step "ncu_sm90_$shape" ncu --clock-control none $NCU_SECTIONS \
    --metrics "$PIPE_METRICS,$STALL_METRICS,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__cycles_elapsed.avg.per_second" -k regex:fwd_kernel --launch-skip 1 -c 1 /tmp/sm90_check one ${shape//x/ }
done
for spec in ${NCU_BWD:-}; do
  IFS=: read -r impl d s c <<< "$spec"
  TAIL=3 step "ncu_bwd_$impl${d}x${s}x$c" ncu --clock-control none $NCU_SECTIONS --section LaunchStats \
    --metrics "$PIPE_METRICS,$STALL_METRICS,smsp__inst_executed.sum,sm__cycles_elapsed.avg.per_second" \
    -k regex:"dkdv_kernel|flash_bwd_dq_dk_dv" -c 1 \
    python3 scripts/profile_bwd.py --impl "$impl" --d "$d" --seqlen "$s" $( [ "$c" = 1 ] && echo --causal )
done
for spec in ${NCU_FWD:-}; do
  IFS=: read -r impl d s c <<< "$spec"
  TAIL=3 FLASH_ATTN_T_BACKEND=sm80 step "ncu_fwd_$impl${d}x${s}x$c" ncu --clock-control none $NCU_SECTIONS \
    --section LaunchStats --metrics "$PIPE_METRICS,$STALL_METRICS,smsp__inst_executed.sum,sm__cycles_elapsed.avg.per_second" \
    -k regex:"sm80_fwd_kernel|flash_fwd_kernel" -c 1 \
    python3 scripts/profile_bwd.py --impl "$impl" --d "$d" --seqlen "$s" $( [ "$c" = 1 ] && echo --causal )
done
for spec in ${NCU_SDPA:-}; do
  IFS=: read -r impl d s c <<< "$spec"
  TAIL=3 step "ncu_sdpa_$impl${d}x${s}x$c" ncu --clock-control none $NCU_SECTIONS \
    --section LaunchStats --metrics "$PIPE_METRICS,$STALL_METRICS,smsp__inst_executed.sum,sm__cycles_elapsed.avg.per_second" \
    -k regex:"fprop|fwd|sdpa|flash|Fprop|attn" -c 1 \
    python3 scripts/profile_bwd.py --impl "$impl" --d "$d" --seqlen "$s" $( [ "$c" = 1 ] && echo --causal )
done
for shape in ${NCU_SM90_SOURCE:-}; do
  [ -x /tmp/sm90_check ] || continue
  TAIL=3 step "ncu_src_run_$shape" ncu --clock-control none --section SourceCounters --section WarpStateStats \
    --import-source no -o "/tmp/ncu_src_$shape" -f -k regex:fwd_kernel --launch-skip 1 -c 1 \
    /tmp/sm90_check one ${shape//x/ }
  TAIL=2 step "ncu_src_$shape" ncu -i "/tmp/ncu_src_$shape.ncu-rep" --page source --csv --print-source sass
  mv "$LOGS/ncu_src_$shape.log" "$LOGS/ncu_src_$shape.csv"
done
for spec in ${BWD_KERNELS:-}; do
  IFS=: read -r d s c <<< "$spec"
  for impl in fat fa2; do
    TAIL=12 step "bwd_kernels_$impl${d}x${s}x$c" python3 scripts/profile_bwd.py --kernels \
      --impl "$impl" --d "$d" --seqlen "$s" $( [ "$c" = 1 ] && echo --causal )
  done
done
[ -n "${SKIP_BUILD:-}" ] && exit 0
grep -E "ptxas info|spill" "$LOGS/build.log" | grep -B1 -E "[1-9][0-9]* bytes spill" | head -20
step main python3 -m flash_attn_t --seqlen 1024
if [ -n "${TESTS:-}" ]; then
  TAIL=40 step tests timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider $TESTS
fi
if [ -n "${TESTS_SM80:-}" ]; then
  TAIL=20 FLASH_ATTN_T_BACKEND=sm80 step tests_sm80 timeout 300 python3 -m pytest -q -p no:cacheprovider $TESTS_SM80
fi
if [ -n "${SANITIZE:-}" ]; then
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
    TAIL=6 step "sanitize_$tool" compute-sanitizer --tool $tool --error-exitcode 3 python3 scripts/sanitize_small.py
  done
  for tool in ${SANITIZE_SM80_TOOLS-memcheck racecheck}; do  # sm80 forward too (auto: sm90a); "" = none
    TAIL=6 FLASH_ATTN_T_BACKEND=sm80 step "sanitize_sm80_$tool" compute-sanitizer --tool $tool \
      --error-exitcode 3 python3 scripts/sanitize_small.py
  done
fi
if [ -n "${BENCH:-}" ]; then
  for entry in ${BENCH_SUITES:-as_given}; do  # suite or suite:seconds (default 300)
    suite=${entry%%:*}; limit=300; [ "$entry" != "$suite" ] && limit=${entry#*:}
    [ "$suite" = as_given ] && suite_arg="" || suite_arg="--suite $suite"
    # new points stop at 4/5 of the limit, so the suite's md and plots get written
    TAIL=40 step "bench_$suite" timeout "$limit" python3 benchmarks/bench.py --device cuda \
      --out "$OUT/res" --time-limit $((limit * 4 / 5)) $suite_arg $BENCH
  done
fi
if [ -n "${BENCH_PLAN:-}" ]; then
  while read -r limit name args <&3; do
    case "$limit" in ''|'#'*) continue ;; esac
    TAIL=30 step "bench_$name" timeout "$limit" python3 benchmarks/bench.py --device cuda \
      --out "$OUT/res/$name" --time-limit $((limit * 4 / 5)) $args < /dev/null
  done 3< "$BENCH_PLAN"
fi
if [ -n "${TRAIN:-}" ]; then
  TAIL=30 step train timeout ${TRAIN_TIMEOUT:-300} python3 benchmarks/train_llama.py --device cuda --out "$OUT/res" $TRAIN
fi
if [ -n "${PROBE+x}" ]; then
  TAIL=40 step probe timeout ${PROBE_TIMEOUT:-120} python3 scripts/fwd_timing_probe.py $PROBE
fi
if [ -n "${TESTS_LATE:-}" ]; then
  TAIL=25 step tests_late timeout 240 python3 -m pytest -q -p no:cacheprovider $TESTS_LATE
fi
