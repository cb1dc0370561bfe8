#!/usr/bin/env bash
# device call 3 (seventeenth session): pool launch configurations; fp32 ResNet-50 eager vs +graph; bf16 winners after the pair kernels
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
gunzip -c .gl/cache2.json.gz > /tmp/og-cache.json
export OPGRAPH_CACHE=/tmp/og-cache.json
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date; git rev-parse HEAD; git status --short | head -30) > $R/device.txt
timeout 90 python3 .gl/pool_launch.py > $R/a-pool-launch.log 2>&1
echo "a rc=$? $(date)" >> $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --lowering auto"
timeout 150 $B --model resnet50 --precision fp32 --dtype float32 --layout nhwc --json $R/b-fp32-resnet50.json > $R/b.log 2>&1
echo "b rc=$? $(date)" >> $R/device.txt
timeout 110 $B --model alexnet,overfeat,vgg_a --precision bf16 --dtype bfloat16 --layout nhwc --json $R/c-bf16-winners.json > $R/c.log 2>&1
echo "c rc=$? $(date)" >> $R/device.txt
gzip -c /tmp/og-cache.json > $OUT/autotune-cache.json.gz
tar czf $OUT/call3.tgz -C $R .
