#!/usr/bin/env bash
# device call 4 (eighteenth session): fp32 ResNet-50 and DenseNet-121 eager vs +graph after the memcpy copies; GoogLeNet bf16 with the strided-form autotune, beside torch-compile+graph, and its profile
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
gunzip -c .gl/cache3.json.gz > /tmp/og-cache.json
export OPGRAPH_CACHE=/tmp/og-cache.json
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date; git rev-parse HEAD; git status --short | head -30) > $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --lowering auto"
timeout 100 $B --model resnet50 --precision fp32 --dtype float32 --layout nhwc --json $R/a-fp32-resnet50.json > $R/a.log 2>&1
echo "a rc=$? $(date)" >> $R/device.txt
timeout 130 $B --model densenet121 --precision fp32 --dtype float32 --layout nhwc --json $R/b-fp32-densenet121.json > $R/b.log 2>&1
echo "b rc=$? $(date)" >> $R/device.txt
G="opgraph-bench --device cuda --warmup 5 --repeat 10 --precision bf16 --dtype bfloat16 --layout nhwc --model googlenet --lowering auto"
timeout 260 $G --cuda-graph --no-per-layer --compare torch-compile+graph --json $R/c-googlenet.json > $R/c.log 2>&1
echo "c rc=$? $(date)" >> $R/device.txt
timeout 60 $G --profile --json $R/d-profile-googlenet.json > $R/d.log 2>&1
echo "d rc=$? $(date)" >> $R/device.txt
gzip -c /tmp/og-cache.json > $OUT/autotune-cache.json.gz
tar czf $OUT/call4.tgz -C $R .
