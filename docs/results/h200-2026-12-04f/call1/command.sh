#!/usr/bin/env bash
# device call 1 (twentieth session): bf16 DenseNet-121 beside torch-compile+graph (its own run),
# then the GPU test files changed since the nineteenth session's last call
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
gunzip -c .gl/cache.json.gz > /tmp/og-cache.json
export OPGRAPH_CACHE=/tmp/og-cache.json
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date; git rev-parse HEAD) > $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --lowering auto --cuda-graph --no-per-layer --precision bf16 --dtype bfloat16 --layout nhwc --compare torch-compile+graph"
timeout 430 $B --model densenet121 --json $R/a-bf16-densenet121.json > $R/a-densenet121.log 2>&1
echo "densenet121 rc=$? $(date) SECONDS=$SECONDS" >> $R/device.txt
gzip -c /tmp/og-cache.json > $OUT/autotune-cache.json.gz
for f in tests/gpu/test_bf16_kernels.py tests/gpu/test_cuda_graph.py; do
  left=$((570 - SECONDS)); [ $left -lt 20 ] && { echo "$f not run: no time left" >> $R/device.txt; continue; }
  timeout $left python3 -m pytest -q -p no:cacheprovider -m gpu $f > $R/t-$(basename $f .py).log 2>&1
  echo "$f rc=$? SECONDS=$SECONDS" >> $R/device.txt
done
tar czf $OUT/call1.tgz -C $R .
