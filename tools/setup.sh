#!/usr/bin/env bash
# Set up a virtual environment in .venv with edgespec, its export extra and the dev tools.
# torch is pinned to the CPU build first (2.13.0): left to itself pip would pick a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[export,bench,dev]"
# edgespec's row kernel (an ONNX Runtime custom op, C++): built here when a compiler and ONNX Runtime's
# C API header are at hand (the header from Debian's libonnxruntime-dev, MIT); without them the export
# never offers it, and setup goes on
.venv/bin/python -m edgespec.engines.rowop setup || echo "edgespec: row kernel skipped (see above); everything else works"
echo "edgespec is set up in .venv ($(.venv/bin/python -c 'import edgespec; print(edgespec.__version__)'))"
