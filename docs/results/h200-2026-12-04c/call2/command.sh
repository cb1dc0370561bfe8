#!/usr/bin/env bash
# device call 2 (seventeenth session): bf16 pair kernels for the max-pool scan and gather: GPU tests, kernel times, ncu, GoogLeNet
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
gunzip -c .gl/cache1.json.gz > /tmp/og-cache.json
export OPGRAPH_CACHE=/tmp/og-cache.json
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date; git rev-parse HEAD; git status --short | head -30) > $R/device.txt
timeout 150 python3 -m pytest tests/gpu/test_pool_vector_gpu.py tests/gpu/test_zero_copy_pool_gpu.py -m gpu -q -rf -p no:cacheprovider --timeout 100 > $R/a-pytest.log 2>&1
echo "a rc=$? $(date)" >> $R/device.txt
timeout 60 python3 .gl/ncu_pool.py --time > $R/b-pool-times.log 2>&1
echo "b rc=$? $(date)" >> $R/device.txt
timeout 60 ncu --clock-control none -k regex:"opgraph_pool_vec_(arg|bwd)" -c 8 --section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis python3 .gl/ncu_pool.py > $R/c-ncu.log 2>&1
echo "c rc=$? $(date)" >> $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --precision bf16 --dtype bfloat16 --layout nhwc --model googlenet --lowering auto"
timeout 170 $B --cuda-graph --no-per-layer --compare torch-compile+graph --json $R/d-googlenet.json > $R/d.log 2>&1
echo "d rc=$? $(date)" >> $R/device.txt
timeout 90 $B --profile --json $R/e-profile-googlenet.json > $R/e.log 2>&1
echo "e rc=$? $(date)" >> $R/device.txt
gzip -c /tmp/og-cache.json > $OUT/autotune-cache.json.gz
tar czf $OUT/call2.tgz -C $R .
