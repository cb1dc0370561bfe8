#!/usr/bin/env bash
# Twenty-ninth session, fourth device call. Call 3: ConvNeXt-tiny 28.8 ms with bias-remat, slower than
# call 1's 28.3: its fused chains read the (C,) bias through a strided load (coordinates divided per
# lane) and ran at 45 % of the copy bandwidth (the GELU alone 82 %). A bias varying along a trailing
# block of a C-order iteration is now one packed column (one division per vector). Predicted
# (docs/performance.md): forward chains 3.81 -> ~2.0 ms, backward 4.30 -> ~2.9, step ~25.6 ms (~0.79x).
. docs/results/h200-2026-12-05/device-setup.sh  # wheels, package, cache, $R, device.txt
timeout 120 python3 -m pytest tests/gpu/test_codegen_gpu.py tests/gpu/test_fuse_gpu.py -m gpu -q -rf -p no:cacheprovider \
  -k "trailing or bias_gelu or bias_relu_channel or fused_training_steps" > $R/t-gpu.log 2>&1
rc=$?; echo "gpu tests rc=$rc $(tail -n 1 $R/t-gpu.log) SECONDS=$SECONDS" >> $R/device.txt
[ $rc -eq 0 ] || { echo "GPU tests failed: nothing else run" >> $R/device.txt; tar czf $OUT/call.tgz -C $R .; exit 0; }
M=tests/onnx/models/convnext_tiny.onnx
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto --compare torch-compile+graph --precision bf16 --dtype bfloat16"
left=$((${T:-540} - SECONDS)); timeout $(( left < 240 ? left : 240 )) $B --batch 128 --onnx $M --json $R/a-onnx-convnext_tiny.json > $R/a.log 2>&1
echo "onnx convnext_tiny rc=$? SECONDS=$SECONDS" >> $R/device.txt
left=$((${T:-540} - SECONDS)); [ $left -gt 40 ] && { timeout $left opgraph-bench --profile --onnx $M --batch 128 --dtype bfloat16 --precision bf16 --layout nhwc --json $R/b-profile-convnext_tiny.json > $R/b.log 2>&1; echo "profile convnext_tiny rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
left=$((${T:-540} - SECONDS)); [ $left -gt 150 ] && { timeout $left $B --model efficientnet_b0 --json $R/c-efficientnet_b0.json > $R/c.log 2>&1; echo "efficientnet_b0 rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
