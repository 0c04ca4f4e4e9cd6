#!/usr/bin/env bash
# The prepared GPU check (run on the lent machine from the repository root; under 8 minutes).
#   bash tools/device_check.sh            -> $OUT/device_check.json (OUT defaults to ./out)
# The GPU machine has no network: wheels it lacks travel in shared/wheels/ (onnxruntime-gpu in
# chunks *.whl.part-* joined here) and the default model's GGUF in shared/models/ (chunks too).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
SITE=/tmp/edgespec-site; mkdir -p "$SITE"
join() { for base in $(ls "$1"/*.part-* 2>/dev/null | sed 's/\.part-.*//' | sort -u); do
           [ -f "$base" ] || cat "$base".part-* > "$base"; done; }
if [ -d shared/wheels ]; then
  join shared/wheels
  python3 -m pip install -q --no-deps --target "$SITE" shared/wheels/*.whl || echo "wheel install failed"
fi
GGUF_ARG=()
if [ -d shared/models ]; then
  join shared/models
  g=$(ls shared/models/*.gguf 2>/dev/null | head -1); [ -n "$g" ] && GGUF_ARG=(--gguf "$g")
fi
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
python3 -m pip install -q --no-deps --no-build-isolation -e . || echo "editable install failed"
timeout 450 python3 tools/device_check.py --out "$OUT/device_check.json" "${GGUF_ARG[@]}" --limit 6
echo "device check exit $?"
