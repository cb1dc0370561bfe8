#!/usr/bin/env bash
# device call 1 (nineteenth session): the GPU tests call 6 of the eighteenth session did not reach,
# the new bias-gradient and whole-plane average-pool kernels' tests, their microbenchmark, GoogLeNet's profile
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
gunzip -c .gl/cache.json.gz > /tmp/og-cache.json
export OPGRAPH_CACHE=/tmp/og-cache.json
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date; git rev-parse HEAD; git status --short | head -30) > $R/device.txt
timeout 60 python3 scripts/bias_grad_bench.py --sweep --json $R/a-bias-grad.jsonl > $R/a.log 2>&1
echo "a rc=$? $(date)" >> $R/device.txt
timeout 100 python3 -m pytest tests/gpu/test_bf16_kernels.py tests/gpu/test_codegen_gpu.py tests/gpu/test_pool_vector_gpu.py -m gpu -q -rf -p no:cacheprovider --timeout 90 -k "bias or whole or AvgPool or tile" > $R/b-pytest-new.log 2>&1
echo "b rc=$? $(date)" >> $R/device.txt
G="opgraph-bench --device cuda --warmup 5 --repeat 10 --precision bf16 --dtype bfloat16 --layout nhwc --model googlenet --lowering auto"
timeout 100 $G --profile --json $R/c-profile-googlenet.json > $R/c.log 2>&1
echo "c rc=$? $(date)" >> $R/device.txt
timeout 230 python3 -m pytest tests/gpu/test_pool_vector_gpu.py tests/gpu/test_fuse_gpu.py tests/gpu/test_held_stream_gpu.py tests/gpu/test_memory_gpu.py tests/gpu/test_models_gpu.py tests/gpu/test_peers_gpu.py tests/gpu/test_profile_gpu.py tests/gpu/test_reference_pool_cupy.py tests/gpu/test_unfold_gpu.py tests/gpu/test_zero_copy_pool_gpu.py -m gpu -q -rf -p no:cacheprovider --timeout 120 > $R/d-pytest-rest.log 2>&1
echo "d rc=$? $(date)" >> $R/device.txt
gzip -c /tmp/og-cache.json > $OUT/autotune-cache.json.gz
tar czf $OUT/call1.tgz -C $R .
