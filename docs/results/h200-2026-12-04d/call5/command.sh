#!/usr/bin/env bash
# device call 5 (eighteenth session): the tile pool kernels (bit for bit, times); GPU pool tests; GoogLeNet bf16 with the 2-D memcpy and the tile variant, beside torch-compile+graph, and its profile
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
gunzip -c .gl/cache3.json.gz > /tmp/og-cache.json
export OPGRAPH_CACHE=/tmp/og-cache.json
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date; git rev-parse HEAD; git status --short | head -30) > $R/device.txt
timeout 90 python3 scripts/pool_variant_bench.py > $R/a-pool-variant.jsonl 2> $R/a.err
echo "a rc=$? $(date)" >> $R/device.txt
timeout 100 python3 -m pytest tests/gpu/test_pool_vector_gpu.py tests/gpu/test_zero_copy_pool_gpu.py -q -rf -p no:cacheprovider --timeout 90 > $R/b-pytest.log 2>&1
echo "b rc=$? $(date)" >> $R/device.txt
G="opgraph-bench --device cuda --warmup 5 --repeat 10 --precision bf16 --dtype bfloat16 --layout nhwc --model googlenet --lowering auto"
timeout 300 $G --cuda-graph --no-per-layer --compare torch-compile+graph --json $R/c-googlenet.json > $R/c.log 2>&1
echo "c rc=$? $(date)" >> $R/device.txt
timeout 60 $G --profile --json $R/d-profile-googlenet.json > $R/d.log 2>&1
echo "d rc=$? $(date)" >> $R/device.txt
gzip -c /tmp/og-cache.json > $OUT/autotune-cache.json.gz
tar czf $OUT/call5.tgz -C $R .
