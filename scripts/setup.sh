#!/usr/bin/env bash
# Sets Sluice up on a fresh machine: redis-server (when missing), a virtual environment in
# .venv with the project and its CPU extras, and the example model repository.
# SLUICE_EXTRAS=gpu,test selects onnxruntime-gpu + pynvml instead of the CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "setup: installing redis-server (Debian package)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq redis-server >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[${SLUICE_EXTRAS:-cpu,test}]"
# The pytorch backend's tests run where the CPU torch wheel is at hand locally
# (never a multi-gigabyte CUDA download); elsewhere they skip.
if ls /opt/wheels/torch-2.13.0*cpu*.whl >/dev/null 2>&1; then
  TORCH_WHEEL=$(ls /opt/wheels/torch-2.13.0*cpu*.whl | head -n 1)
  echo "setup: installing torch from $TORCH_WHEEL"
  .venv/bin/python -m pip install -q "$TORCH_WHEEL"
  # The sentence-embedding example (examples/nlp) needs torch for its ONNX export and as
  # the in-process reference; with the CPU wheel in place its extra adds no CUDA build.
  .venv/bin/python -m pip install -q -e ".[nlp]"
fi
.venv/bin/python examples/build_models.py
echo "setup: done"
