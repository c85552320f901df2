#!/bin/bash
# The GPU paths of Sluice on a machine with a CUDA device, in one run (README "On a GPU"):
# the GPU e2e tests, the metrics and backend tests beside them, the worker unit tests,
# then benchmarks/bench_gpu.py. Elsewhere the GPU tests skip and bench_gpu.py refuses.
#
#   bash scripts/gpu_check.sh            # after scripts/setup.sh (uses .venv/bin/python)
#
# On a bare machine that already has torch (a lent GPU machine, Python 3.12), put the
# other dependencies' wheels in .whl/ beforehand, for example
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       --platform manylinux_2_28_x86_64 --platform any -d .whl "tritonclient[http,grpc]" \
#       fastapi "uvicorn[standard]" "redis[hiredis]" msgpack orjson python-rapidjson \
#       pydantic pydantic-settings prometheus-client celery pytest-asyncio skl2onnx
# (then drop what the machine has: numpy, torch, ...), and a redis-server binary with its
# libraries in .gpu/bin and .gpu/lib; they are installed under /tmp/site and put on the
# paths first, with the project installed beside them. Logs go to $OUT when it is set, else to /tmp.
set -u
cd "$(dirname "$0")/.."
logs=${OUT:-/tmp}
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
if [ "$python" = python3 ] && [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 3
    # the project itself, editable (its one import name ``sluice`` maps the top-level
    # folders; a plain copy would be shadowed by ./sluice)
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 3
    export PYTHONPATH=/tmp/site
fi
[ -d .gpu/bin ] && export PATH=$PWD/.gpu/bin:$PATH
[ -d .gpu/lib ] && export LD_LIBRARY_PATH=$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null
"$python" - <<'PY'
import onnxruntime, torch
print("torch", torch.__version__, "cuda" if torch.cuda.is_available() else "no cuda",
      "| onnxruntime", onnxruntime.__version__, onnxruntime.get_available_providers())
PY
started=$(date +%s)
timeout 400 "$python" -m pytest -q -p no:cacheprovider tests/e2e/test_gpu.py \
    tests/e2e/test_metrics.py tests/e2e/test_backends_torch.py \
    tests/e2e/test_backends_tensorrt.py tests/e2e/test_cuda_shared_memory.py \
    tests/unit/gpu_workers 2>&1 | tee "$logs/gpu_pytest.log" | tail -15
tests=${PIPESTATUS[0]}
echo "tests: exit $tests, $(( $(date +%s) - started )) s"
timeout 180 "$python" benchmarks/bench_gpu.py --duration 4 2>&1 | tee "$logs/gpu_bench.log" | tail -20
exit "$tests"
