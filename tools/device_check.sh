#!/usr/bin/env bash
# The prepared GPU check (tools/device_check.py), and its rehearsal on this machine's CPU.
#
#   bash tools/device_check.sh --dry-run   # here: exports .devpack/engines if missing, runs every stage
#                                          #   on the cpu provider (device code on host memory) -> out/
#   bash tools/device_check.sh             # on the lent GPU machine, in every call of the sequence below
#
# The sequence for a loan (tools/device_pack.py prints it with the real carry lists):
#   0. Here, before asking for the machine:   python tools/device_pack.py
#      It exports the tiny engine folders (nothing is exported there: no gguf, no network), downloads
#      onnxruntime-gpu 1.31.1 (the CUDA 13 build, python 3.12) and repacks its files as one xz tar
#      (203 MB instead of the 256 MB wheel), builds edgespec's wheel, and cuts all of it into pieces
#      that fit beside the tree in one call (64 MiB a call, the tree included: 31.7 MiB with other
#      sessions' work on 2026-12-05, so 30 MiB of pieces a call: 7 calls for 215 MiB). Their carry
#      lists: .devpack/calls.json.
#   1..N. run(command="bash tools/device_check.sh", timeout_s=600, carry=[the call's pieces,
#      ".devpack/send/PIECES"]), the calls back to back: the machine goes back 30 s after a call ends,
#      and the pieces with it (`status` says warm: false; then start again at call 1). Each call keeps
#      what it carried in /tmp/edgespec-devpack and says which pieces are still to come; the call that
#      brings the last one checks them all (sha256), unpacks onnxruntime-gpu and edgespec into
#      /tmp/edgespec-site (PYTHONPATH) and the folders into /tmp/edgespec-devpack/engines, and runs the
#      check: $OUT/device_check.json (rewritten after every stage) and $OUT/device_check.log.
#   Budget: ~1-2 min to start, a few seconds per carrying call, the check under 6 min (its stages are
#   cut by `timeout` at CHECK_SECONDS, keeping what they wrote), so one rerun fits in 15 minutes.
#   If `run` refuses the tree as over 64 MiB, rerun device_pack.py: it sizes pieces to the tree it sees.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
CHECK_SECONDS=${CHECK_SECONDS:-330}

if [ "${1:-}" = "--dry-run" ]; then
  ENGINES=${ENGINES:-.devpack/engines}
  if [ ! -f "$ENGINES/ref/manifest.json" ]; then
    "$PY" tools/device_pack.py --engines-only || exit 2
  fi
  exec "$PY" tools/device_check.py --dry-run --engines "$ENGINES" --out "$OUT/device_check.json" "${@:2}"
fi

STORE=/tmp/edgespec-devpack
SITE=/tmp/edgespec-site
"$PY" tools/device_pack.py --collect .devpack/send "$STORE" "$SITE"
rc=$?
[ $rc -eq 3 ] && exit 0  # pieces still to come: the next call brings them
[ $rc -ne 0 ] && exit $rc
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/device_check.log"
PYTHONUNBUFFERED=1 timeout "$CHECK_SECONDS" "$PY" tools/device_check.py --engines "$STORE/engines" \
  --out "$OUT/device_check.json" "$@" 2>&1 | tee -a "$OUT/device_check.log"
echo "device check exit ${PIPESTATUS[0]}"
