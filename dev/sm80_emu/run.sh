#!/usr/bin/env bash
# run.sh - builds and runs the host emulator of the sm80 forward and backward kernels
# (no GPU needed): every test case in emu_main.cpp against a float64
# reference, first with cp.async copies landing at wait_group (catches reads
# before the wait), then at issue (EMU_EAGER).  Needs g++ >= 10 and gcc.
# EMU_ONLY=substring runs the matching cases only.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$here/../.."
out="$here/build"
mkdir -p "$out/gen"
python3 "$here/make_host_copies.py" "$out/gen"
gcc -O2 -std=c11 -I"$repo/csrc" -c "$repo/csrc/fat_common.c" -o "$out/fat_common.o"
g++ -std=c++20 -O2 -include "$here/emu_shim.h" -I"$out/gen" -I"$repo/csrc" \
    "$here/emu_main.cpp" "$out/fat_common.o" -o "$out/emu"
"$out/emu"
EMU_EAGER=1 "$out/emu"
