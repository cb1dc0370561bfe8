#!/usr/bin/env bash
# device call 3 (twenty-second session): pool-scan and relu-bias-sums on OverFeat and VGG-A beside
# torch-compile+graph, on ResNet-50 and DenseNet-121 (their one max pool each) alone, then the fusion GPU tests
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export OPGRAPH_CACHE=/tmp/og-cache.json.gz
[ -f $OPGRAPH_CACHE ] || cp .gl/cache.json.gz $OPGRAPH_CACHE
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date) > $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --precision bf16 --dtype bfloat16 --layout nhwc --lowering auto,include=pool-scan+relu-bias-sums"
left=$((540 - SECONDS)); timeout $left $B --model overfeat,vgg_a --compare torch-compile+graph --json $R/a-bf16-overfeat-vgg_a.json > $R/a.log 2>&1
echo "a rc=$? SECONDS=$SECONDS" >> $R/device.txt
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
left=$((540 - SECONDS)); [ $left -gt 60 ] && { timeout $left $B --model resnet50,densenet121 --json $R/b-bf16-resnet50-densenet121.json > $R/b.log 2>&1; echo "b rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
left=$((540 - SECONDS)); [ $left -gt 40 ] && { timeout $left python3 -m pytest tests/gpu/test_fuse_gpu.py -m gpu -q -rf -p no:cacheprovider --durations=3 > $R/t-fuse.log 2>&1; echo "fuse rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
tar czf $OUT/call.tgz -C $R .
