#!/usr/bin/env bash
# The main job on a fresh machine: install, build, run the example.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
dir=$(scripts/build.sh)
"$dir/vector_add_c" "$@"
