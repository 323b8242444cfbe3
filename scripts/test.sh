#!/usr/bin/env bash
# Every test on a fresh machine: install, build, run ctest.
# PTO_SANITIZE=address|thread runs the suite under ASan+UBSan or TSan;
# PTO_MPI=off runs it on a build without the MPI scale-out.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
dir=$(scripts/build.sh)
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}"
run=()
# TSan's shadow layout does not fit a kernel with high mmap entropy; run the
# suite with address randomisation off there.
if [[ "${PTO_SANITIZE:-}" == thread ]] && setarch "$(uname -m)" -R true 2>/dev/null; then
  run=(setarch "$(uname -m)" -R)
fi
cd "$dir"
"${run[@]}" ctest --output-on-failure -j"$(nproc)"
