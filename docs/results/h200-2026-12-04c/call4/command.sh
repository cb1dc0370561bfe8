#!/usr/bin/env bash
# device call 4 (seventeenth session): pool launch change (GPU pool tests), the replay's backward-data on fp32 ResNet-50, GoogLeNet bf16 with its peer
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
gunzip -c .gl/cache3.json.gz > /tmp/og-cache.json
export OPGRAPH_CACHE=/tmp/og-cache.json
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date; git rev-parse HEAD; git status --short | head -30) > $R/device.txt
timeout 120 python3 -m pytest tests/gpu/test_pool_vector_gpu.py tests/gpu/test_zero_copy_pool_gpu.py -m gpu -q -rf -p no:cacheprovider --timeout 100 > $R/a-pytest.log 2>&1
echo "a rc=$? $(date)" >> $R/device.txt
timeout 150 python3 .gl/stream_diag.py > $R/b-stream-diag.log 2>&1
echo "b rc=$? $(date)" >> $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --precision bf16 --dtype bfloat16 --layout nhwc --model googlenet --lowering auto"
timeout 170 $B --cuda-graph --no-per-layer --compare torch-compile+graph --json $R/c-googlenet.json > $R/c.log 2>&1
echo "c rc=$? $(date)" >> $R/device.txt
timeout 80 $B --profile --json $R/d-profile-googlenet.json > $R/d.log 2>&1
echo "d rc=$? $(date)" >> $R/device.txt
gzip -c /tmp/og-cache.json > $OUT/autotune-cache.json.gz
tar czf $OUT/call4.tgz -C $R .
