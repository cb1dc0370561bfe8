#!/usr/bin/env bash
# Prepared in the twentieth session for the next device call (never run: device loans were paused).
# Carry [".whl", ".gl"] with the cache at .gl/cache.json.gz (gunzip-able copy of
# docs/results/h200-2026-12-04f/autotune-cache.json.gz). Checks the two opt-in rules' kernels on the
# GPU, then times GoogLeNet and AlexNet in bf16 with them beside torch-compile+graph, then without
# them and without the peer (its ~150 s of compile is paid once; the rules' predicted saving, ~4 % of
# GoogLeNet's step, is well above the 0.5 % drift between two runs of one session).
# The cache's decisions among which one of our `cuda` or `unfold` rules competes predate the kernels'
# source fingerprint in the key (backends/cuda/kernel_sources.py): pooling, the bias gradients, ReLU,
# threshold and their gradients (`cuda` against `codegen`: ~130 entries), and the convolutions where
# the depthwise or stem-unfold kernels compete with cuDNN's engines. They are tuned again once, with a
# note each ("tuned on other kernel code"), NVRTC compiles included. Decisions among cuDNN's engines
# alone, or of `codegen` alone (batch statistics), are reused: neither is fingerprinted.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
[ -f /tmp/og-cache.json ] || gunzip -c .gl/cache.json.gz > /tmp/og-cache.json
export OPGRAPH_CACHE=/tmp/og-cache.json
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date) > $R/device.txt
for f in pool_scan_gpu relu_bias_sums_gpu; do
  timeout 120 python3 -m pytest tests/gpu/test_$f.py -m gpu -q -rf -p no:cacheprovider --durations=3 > $R/t-$f.log 2>&1
  echo "$f rc=$? SECONDS=$SECONDS" >> $R/device.txt
done
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --precision bf16 --dtype bfloat16 --layout nhwc --model googlenet,alexnet"
left=$((560 - SECONDS)); timeout $left $B --compare torch-compile+graph --lowering auto,include=pool-scan+relu-bias-sums --json $R/a-with.json > $R/a.log 2>&1
echo "a rc=$? SECONDS=$SECONDS" >> $R/device.txt
left=$((560 - SECONDS)); [ $left -gt 60 ] && { timeout $left $B --lowering auto --json $R/b-without.json > $R/b.log 2>&1; echo "b rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
gzip -c /tmp/og-cache.json > $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
