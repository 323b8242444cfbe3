#!/usr/bin/env bash
# Remake docs/img/trace_bgemm.png: trace a small BGEMM with ptolua --trace,
# draw it with scripts/trace_timeline.lua and photograph the page with
# headless Chromium (Debian: chromium, lua-dkjson). Offline: nothing is
# downloaded. Usage: scripts/trace_screenshot.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PTO_MODE=thread "$build/ptolua" --trace "$tmp/trace.json" examples/bgemm.lua 1 2 2 4 128 2 >/dev/null
lua5.4 scripts/trace_timeline.lua "$tmp/trace.json" "$tmp/trace.html" 1400
chromium --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update \
  --disable-sync --no-first-run --user-data-dir="$tmp/profile" --hide-scrollbars \
  --screenshot="$PWD/docs/img/trace_bgemm.png" --window-size=1400,210 "file://$tmp/trace.html" 2>/dev/null
echo "docs/img/trace_bgemm.png"
