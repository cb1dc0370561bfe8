#!/usr/bin/env bash
# device call 4 (nineteenth session): the modern four in bf16 beside torch-compile+graph, one model per run
# (each its own JSON, so that a model cut by the time limit loses only itself)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
gunzip -c .gl/cache.json.gz > /tmp/og-cache.json
export OPGRAPH_CACHE=/tmp/og-cache.json
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date) > $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --lowering auto --cuda-graph --no-per-layer --precision bf16 --dtype bfloat16 --layout nhwc --compare torch-compile+graph"
for m in mobilenet_v2 efficientnet_b0 resnet50 densenet121; do
  left=$((525 - SECONDS)); [ $left -lt 40 ] && { echo "$m not run: no time left" >> $R/device.txt; continue; }
  timeout $left $B --model $m --json $R/a-bf16-$m.json > $R/a-$m.log 2>&1
  echo "$m rc=$? $(date)" >> $R/device.txt
done
gzip -c /tmp/og-cache.json > $OUT/autotune-cache.json.gz
tar czf $OUT/call4.tgz -C $R .
