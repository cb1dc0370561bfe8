#!/usr/bin/env bash
# device call 2 (twenty-second session): the chunked FFT on CuPy, fp32 NCHW OverFeat beside eager
# PyTorch (fft-chunked in auto), then GoogLeNet's profile with pool-scan and relu-bias-sums
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export OPGRAPH_CACHE=/tmp/og-cache.json.gz
[ -f $OPGRAPH_CACHE ] || cp .gl/cache.json.gz $OPGRAPH_CACHE
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date) > $R/device.txt
timeout 150 python3 -m pytest tests/backends/test_conv_algorithms.py -m gpu -k cupy -q -rf -p no:cacheprovider --durations=3 > $R/t-conv-cupy.log 2>&1
echo "conv-cupy rc=$? SECONDS=$SECONDS" >> $R/device.txt
left=$((560 - SECONDS)); timeout $left opgraph-bench --device cuda --warmup 5 --repeat 10 --model overfeat --precision fp32 --dtype float32 --layout nchw --cuda-graph --no-per-layer --lowering auto --compare torch --json $R/a-fp32-overfeat.json > $R/a.log 2>&1
echo "a rc=$? SECONDS=$SECONDS" >> $R/device.txt
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
left=$((560 - SECONDS)); [ $left -gt 60 ] && { timeout $left opgraph-bench --device cuda --warmup 5 --repeat 10 --precision bf16 --dtype bfloat16 --layout nhwc --model googlenet --lowering auto,include=pool-scan+relu-bias-sums --profile --json $R/b-profile-googlenet.json > $R/b.log 2>&1; echo "b rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
