#!/usr/bin/env bash
# device call 6 (eighteenth session): the whole GPU suite on the final tree; the tile pool kernels (take included); the bf16 winners' auto+graph (no peer) and GoogLeNet's profile
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
gunzip -c .gl/cache5.json.gz > /tmp/og-cache.json
export OPGRAPH_CACHE=/tmp/og-cache.json
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date; git rev-parse HEAD; git status --short | head -30) > $R/device.txt
timeout 380 python3 -m pytest tests -m gpu -q -rf -p no:cacheprovider --timeout 120 > $R/a-pytest-gpu.log 2>&1
echo "a rc=$? $(date)" >> $R/device.txt
timeout 50 python3 scripts/pool_variant_bench.py > $R/b-pool-variant.jsonl 2> $R/b.err
echo "b rc=$? $(date)" >> $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --precision bf16 --dtype bfloat16 --layout nhwc --lowering auto"
timeout 60 $B --cuda-graph --no-per-layer --model alexnet,overfeat,vgg_a --json $R/c-bf16-winners.json > $R/c.log 2>&1
echo "c rc=$? $(date)" >> $R/device.txt
gzip -c /tmp/og-cache.json > $OUT/autotune-cache.json.gz
tar czf $OUT/call6.tgz -C $R .
