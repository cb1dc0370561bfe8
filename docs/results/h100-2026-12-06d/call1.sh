#!/usr/bin/env bash
# Thirtieth session, first device call. (1) The twenty-ninth session's last fixes, never run on a GPU:
# test_codegen_gpu.py's trailing-operand and bias cases (packed columns; PackingError; views never
# packed) and test_fuse_gpu.py whole. (2) tf32 ResNet-50 beside torch-compile+graph on the current
# tree (H200: 1.011x on the twenty-fifth session's tree, before the rows in flight; H100: 0.998x).
. docs/results/h200-2026-12-05/device-setup.sh  # wheels, package, cache, $R, device.txt
timeout 90 python3 -m pytest tests/gpu/test_codegen_gpu.py -m gpu -q -rf -p no:cacheprovider \
  -k "trailing or bias_" > $R/t-codegen.log 2>&1
echo "codegen_gpu rc=$? $(grep -E 'passed|failed' $R/t-codegen.log | tail -n 1) SECONDS=$SECONDS" >> $R/device.txt
timeout 230 python3 -m pytest tests/gpu/test_fuse_gpu.py -m gpu -q -rf -p no:cacheprovider > $R/t-fuse.log 2>&1
echo "fuse_gpu rc=$? $(grep -E 'passed|failed' $R/t-fuse.log | tail -n 1) SECONDS=$SECONDS" >> $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto --compare torch-compile+graph --model resnet50"
left=$((585 - SECONDS)); [ $left -gt 100 ] && { timeout $left $B --precision tf32 --dtype float32 --json $R/a-tf32-resnet50.json > $R/a.log 2>&1; echo "tf32 resnet50 rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
