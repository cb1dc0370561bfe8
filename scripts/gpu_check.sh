#!/usr/bin/env bash
# The one script to run on a GPU machine (see docs/gpu.md for the last run).
#
#   1. installs carried wheels from .whl/ (if any) into /tmp/site, then opgraph (editable);
#   2. prints versions: nvidia-smi, CUDA, CuPy, cuDNN backend and frontend;
#   3. runs the GPU tests (pytest -m gpu over tests/), then the CPU tests if time allows;
#   4. runs a short cuDNN benchmark (scripts/gpu_bench_cudnn.py).
#
# Logs and JUnit XML go to $OUT when set (the device tool's folder), else to
# /tmp/opgraph-gpu-check. Exit status: that of the GPU tests.
# Environment: CPU_TESTS=0 skips step 3's CPU part; BENCH=0 skips step 4; GPU_TEST_TIMEOUT,
# BENCH_TIMEOUT (seconds) and BENCH_ARGS (e.g. --quick) bound the run.
set -uo pipefail
cd "$(dirname "$0")/.."
LOG=${OUT:-/tmp/opgraph-gpu-check}
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

echo "== 1. install ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 2
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    echo "carried wheels: $(ls .whl | tr '\n' ' ')"
fi
$PY -m pip install -q --no-deps --no-build-isolation -e . || { echo "pip install -e . failed"; exit 2; }

echo "== 2. versions"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
$PY - <<'EOF' | tee "$LOG/versions.json"
import json
from opgraph.backends.device import resolve_device, versions
d = resolve_device("auto")
print(json.dumps(dict(versions(), device=str(d), reason=d.reason), indent=1))
EOF

echo "== 3. tests (GPU subset first) [$(elapsed)s]"
timeout "${GPU_TEST_TIMEOUT:-300}" $PY -m pytest tests -m gpu -q -ra -p no:cacheprovider --durations=15 \
    --junitxml="$LOG/junit-gpu.xml" >"$LOG/pytest-gpu.log" 2>&1
status=$?
tail -n 60 "$LOG/pytest-gpu.log"
echo "gpu tests exit status: $status [$(elapsed)s]"
if [ "${CPU_TESTS:-1}" != 0 ]; then
    timeout 150 $PY -m pytest tests -m "not gpu" -q -p no:cacheprovider \
        --junitxml="$LOG/junit-cpu.xml" >"$LOG/pytest-cpu.log" 2>&1
    cpu_status=$?
    tail -n 15 "$LOG/pytest-cpu.log"
    echo "cpu tests exit status: $cpu_status [$(elapsed)s]"
fi

if [ "${BENCH:-1}" != 0 ]; then
    echo "== 4. benchmark [$(elapsed)s]"
    timeout "${BENCH_TIMEOUT:-240}" $PY scripts/gpu_bench_cudnn.py ${BENCH_ARGS:-} --json "$LOG/bench.json"
    echo "benchmark exit status: $? [$(elapsed)s]"
fi
exit "$status"
