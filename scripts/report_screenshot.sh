#!/usr/bin/env bash
# Remake docs/img/report_bgemm.png: the HTML run report (ptolua --report) of a
# small BGEMM, photographed with headless Chromium (Debian: chromium).
# Offline: nothing is downloaded. Usage: scripts/report_screenshot.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PTO_MODE=thread "$build/ptolua" --report "$tmp/run.html" examples/bgemm.lua 1 2 2 4 128 2 >/dev/null
chromium --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
  --disable-sync --no-first-run --user-data-dir="$tmp/profile" --hide-scrollbars \
  --screenshot="$PWD/docs/img/report_bgemm.png" --window-size=1200,1250 "file://$tmp/run.html" 2>/dev/null
echo "docs/img/report_bgemm.png"
