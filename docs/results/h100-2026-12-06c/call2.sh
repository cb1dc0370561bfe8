#!/usr/bin/env bash
# Twenty-ninth session, second device call. Call 1 (the prepared next-call.sh) measured the depthwise
# forward: ConvNeXt-tiny bf16 28.3 against torch-compile+graph's 32.6 ms (0.87x). Since then
# bias-remat (passes/remat_bias_add.py): the first linear layer's bias add of each ConvNeXt block
# recomputed for the GELU's gradient, so the forward fuses it with the GELU and the backward with
# the GELU's gradient (prediction, docs/performance.md: about 2.0 ms fewer, 28.3 -> ~26.3 ms, ~0.81x).
# (1) the fused training steps on the GPU (tests/gpu/test_fuse_gpu.py, now with a ConvNeXt block);
# (2) ConvNeXt-tiny beside torch-compile+graph; (3) its --profile (where the step's time goes now).
. docs/results/h200-2026-12-05/device-setup.sh  # wheels, package, cache, $R, device.txt
timeout 150 python3 -m pytest tests/gpu/test_fuse_gpu.py -m gpu -q -rf -p no:cacheprovider > $R/t-fuse_gpu.log 2>&1
echo "fuse_gpu rc=$? $(tail -n 1 $R/t-fuse_gpu.log) SECONDS=$SECONDS" >> $R/device.txt
M=tests/onnx/models/convnext_tiny.onnx
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto --compare torch-compile+graph --precision bf16 --dtype bfloat16"
left=$((${T:-540} - SECONDS)); timeout $(( left < 230 ? left : 230 )) $B --batch 128 --onnx $M --json $R/a-onnx-convnext_tiny.json > $R/a.log 2>&1
echo "onnx convnext_tiny rc=$? SECONDS=$SECONDS" >> $R/device.txt
left=$((${T:-540} - SECONDS)); [ $left -gt 60 ] && { timeout $left opgraph-bench --profile --onnx $M --batch 128 --dtype bfloat16 --precision bf16 --layout nhwc --json $R/b-profile-convnext_tiny.json > $R/b.log 2>&1; echo "profile convnext_tiny rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
