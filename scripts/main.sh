#!/usr/bin/env bash
# The main job on a fresh machine: install, build, run the BGEMM example on
# the built-in simulated chips. Arguments go to examples/bgemm.lua
# (batch m n k tile chips).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
dir=$(scripts/build.sh)
"$dir/ptolua" examples/bgemm.lua "$@"
