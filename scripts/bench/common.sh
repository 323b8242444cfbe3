# Sourced by the scripts/bench*.sh benchmarks after they set root (the
# repository): build is $BUILD_DIR or build-bench/, and bench_build
# configures a Release build there (with any extra cmake arguments in
# BENCH_CMAKE_ARGS) and builds the targets named.
build="${BUILD_DIR:-$root/build-bench}"

bench_build() {
  # shellcheck disable=SC2086
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release ${BENCH_CMAKE_ARGS:-} >/dev/null
  cmake --build "$build" --target "$@" -j "$(nproc)" >/dev/null
}
