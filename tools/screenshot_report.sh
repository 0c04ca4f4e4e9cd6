#!/usr/bin/env bash
# Render an HTML bench report in headless Chromium to a PNG, to check what a person would see.
#   bash tools/screenshot_report.sh report.html report.png
# Needs Debian's chromium (apt-get install chromium).
set -euo pipefail
html=$(realpath "$1"); png=${2:-${1%.html}.png}
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$profile" --window-size=1100,1900 \
  --screenshot="$png" "file://$html" 2>/dev/null
echo "wrote $png"
