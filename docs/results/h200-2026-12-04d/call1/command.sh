#!/usr/bin/env bash
# device call 1 (eighteenth session): replay pool diagnosis (fp32 ResNet-50); GPU tests of graphs, capture and pooling (incl. the review fixes of 7ac9982); fp32 ResNet-50 eager vs +graph
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
gunzip -c docs/results/h200-2026-12-04c/autotune-cache.json.gz > /tmp/og-cache.json
export OPGRAPH_CACHE=/tmp/og-cache.json
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date; git rev-parse HEAD; git status --short | head -30) > $R/device.txt
timeout 150 python3 -m pytest tests/test_graph_replay.py tests/gpu/test_cuda_graph.py tests/gpu/test_capture_gpu.py tests/gpu/test_profile_gpu.py tests/gpu/test_pool_vector_gpu.py tests/gpu/test_zero_copy_pool_gpu.py -q -rf -p no:cacheprovider --timeout 120 > $R/a-pytest.log 2>&1
echo "a rc=$? $(date)" >> $R/device.txt
timeout 150 python3 .gl/replay_diag.py > $R/b-replay-diag.log 2>&1
echo "b rc=$? $(date)" >> $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --lowering auto"
timeout 150 $B --model resnet50 --precision fp32 --dtype float32 --layout nhwc --json $R/c-fp32-resnet50.json > $R/c.log 2>&1
echo "c rc=$? $(date)" >> $R/device.txt
gzip -c /tmp/og-cache.json > $OUT/autotune-cache.json.gz
tar czf $OUT/call1.tgz -C $R .
