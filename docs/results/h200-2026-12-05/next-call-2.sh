#!/usr/bin/env bash
# Prepared in the twenty-third session (no device was lent then) for the next session's second call,
# after next-call.sh. (1) The tiled transpose of the generated copies: its GPU test, then
# scripts/copy_bench.py (the classifiers' Flatten copies: tiled, the element kernel, CuPy's copy, a
# same-bytes memcpy). (2) bf16 profiles of AlexNet, OverFeat and VGG-A (their last are the fifteenth
# session's): the Flatten / Reshape pair and the threshold gradients with their bias sums in place,
# against docs/performance.md's twenty-third-session predictions. (3) tf32 ResNet-50 beside
# torch-compile+graph (1.018x in the thirteenth session, the one time target missed). (4) GoogLeNet and
# AlexNet bf16 with the final defaults beside torch-compile+graph.
# Copy to .gl/ (the cache: the one next-call.sh returned, at .gl/cache.json.gz) and carry [".whl", ".gl"].
. docs/results/h200-2026-12-05/device-setup.sh  # wheels, package, cache, $R, device.txt
timeout 60 python3 -m pytest tests/gpu/test_copy_transpose_gpu.py -m gpu -q -rf -p no:cacheprovider > $R/t-copy_transpose_gpu.log 2>&1
echo "copy_transpose_gpu rc=$? $(tail -n 1 $R/t-copy_transpose_gpu.log) SECONDS=$SECONDS" >> $R/device.txt
timeout 60 python3 scripts/copy_bench.py --json $R/a-copy-bench.jsonl > $R/a.log 2>&1
echo "copy_bench rc=$? SECONDS=$SECONDS" >> $R/device.txt
P="opgraph-bench --device cuda --warmup 5 --repeat 10 --precision bf16 --dtype bfloat16 --layout nhwc --lowering auto --profile"
timeout 150 $P --model alexnet,overfeat,vgg_a --json $R/b-profile-winners.json > $R/b.log 2>&1
echo "profiles rc=$? SECONDS=$SECONDS" >> $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto --compare torch-compile+graph"
left=$((575 - SECONDS)); [ $left -gt 120 ] && { timeout $(( left < 240 ? left : 240 )) $B --precision tf32 --dtype float32 --model resnet50 --json $R/c-tf32-resnet50.json > $R/c.log 2>&1; echo "tf32 resnet50 rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
left=$((575 - SECONDS)); [ $left -gt 200 ] && { timeout $left $B --precision bf16 --dtype bfloat16 --model googlenet,alexnet --json $R/d-bf16-googlenet-alexnet.json > $R/d.log 2>&1; echo "bf16 googlenet,alexnet rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
