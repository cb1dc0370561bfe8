#!/usr/bin/env bash
# device call 2 (nineteenth session): the GPU test files not reached, one at a time with their own limits
# (durations listed); the bf16 GoogLeNet and AlexNet beside torch-compile+graph in one run
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
gunzip -c .gl/cache.json.gz > /tmp/og-cache.json
export OPGRAPH_CACHE=/tmp/og-cache.json
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date; git status --short | head -40) > $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --precision bf16 --dtype bfloat16 --layout nhwc --lowering auto --cuda-graph --no-per-layer"
timeout 300 $B --model googlenet,alexnet --compare torch-compile+graph --json $R/a-bf16-googlenet-alexnet.json > $R/a.log 2>&1
echo "a rc=$? $(date)" >> $R/device.txt
for f in held_stream_gpu memory_gpu peers_gpu profile_gpu reference_pool_cupy unfold_gpu zero_copy_pool_gpu fuse_gpu models_gpu; do
  left=$((560 - SECONDS)); [ $left -lt 20 ] && { echo "b $f not run: no time left" >> $R/device.txt; continue; }
  lim=$(( left < 90 ? left : 90 ))
  timeout $lim python3 -m pytest tests/gpu/test_$f.py -m gpu -q -rf -p no:cacheprovider --timeout 80 --durations=5 > $R/b-$f.log 2>&1
  echo "b $f rc=$? $(date)" >> $R/device.txt
done
gzip -c /tmp/og-cache.json > $OUT/autotune-cache.json.gz
tar czf $OUT/call2.tgz -C $R .
