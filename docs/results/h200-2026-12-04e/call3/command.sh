#!/usr/bin/env bash
# device call 3 (nineteenth session): bf16 OverFeat and VGG-A beside torch-compile+graph in one run;
# tests/gpu/test_fuse_gpu.py (not reached by call 2's 90 s); fp32 DenseNet-121 +graph against eager if time is left
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
gunzip -c .gl/cache.json.gz > /tmp/og-cache.json
export OPGRAPH_CACHE=/tmp/og-cache.json
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date) > $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --lowering auto --cuda-graph --no-per-layer"
timeout 260 $B --precision bf16 --dtype bfloat16 --layout nhwc --model overfeat,vgg_a --compare torch-compile+graph --json $R/a-bf16-overfeat-vgg.json > $R/a.log 2>&1
echo "a rc=$? $(date)" >> $R/device.txt
left=$((565 - SECONDS)); lim=$(( left < 260 ? left : 260 ))
timeout $lim python3 -m pytest tests/gpu/test_fuse_gpu.py -m gpu -q -rf -p no:cacheprovider --timeout 200 --durations=20 > $R/b-fuse.log 2>&1
echo "b rc=$? $(date)" >> $R/device.txt
left=$((570 - SECONDS))
if [ $left -gt 60 ]; then
  timeout $left $B --precision fp32 --dtype float32 --layout nhwc --model densenet121 --json $R/c-fp32-densenet.json > $R/c.log 2>&1
  echo "c rc=$? $(date)" >> $R/device.txt
fi
gzip -c /tmp/og-cache.json > $OUT/autotune-cache.json.gz
tar czf $OUT/call3.tgz -C $R .
