#!/usr/bin/env bash
# Prepared in the twenty-eighth session for the next session's FIRST call (the session's device time ran
# out before it could run). Copy to .gl/ with docs/results/h100-2026-12-06b/autotune-cache.json.gz at
# .gl/cache.json.gz; carry [".whl", ".gl"]. Runs on an H100 or an H200 (T: the seconds it may use, 575).
# The stride-1 depthwise forward kernel (backends/cuda/depthwise_forward.py), built after call 3's profile
# put 30.5 of ConvNeXt-tiny's 56.4 ms in cuDNN's depthwise 7x7 forwards (prediction: docs/performance.md,
# twenty-eighth session): (1) its GPU tests beside cuDNN and float64 (tests/gpu/test_depthwise_gpu.py), and
# scripts/depthwise_bench.py: every cuDNN engine on ConvNeXt's 7x7 layers with and without the bias in its
# graph (our cudnn lowering built 5 engines with it, 4.18-22.7 ms; PyTorch's unfused call on the same cuDNN
# ran all 18 layers in 2.32 ms), beside the gather;
# (2) ConvNeXt-tiny from ONNX beside torch-compile+graph; (3) MobileNet-v2 and EfficientNet-B0 (stride-1 3x3 and 5x5 depthwise layers), time permitting.
. docs/results/h200-2026-12-05/device-setup.sh  # wheels, package, cache, $R, device.txt
timeout 120 python3 -m pytest tests/gpu/test_depthwise_gpu.py -m gpu -q -rf -p no:cacheprovider > $R/t-depthwise_gpu.log 2>&1
rc=$?; echo "depthwise_gpu rc=$rc $(tail -n 1 $R/t-depthwise_gpu.log) SECONDS=$SECONDS" >> $R/device.txt
# a kernel that faults on the device would end an autotune that times it: nothing more unless its tests pass
[ $rc -eq 0 ] || { echo "depthwise tests failed: nothing else run" >> $R/device.txt; tar czf $OUT/call.tgz -C $R .; exit 0; }
timeout 90 python3 scripts/depthwise_bench.py --warmup 2 --repeat 10 --json $R/d-depthwise-bench.jsonl > $R/d.log 2>&1
echo "depthwise_bench rc=$? SECONDS=$SECONDS" >> $R/device.txt
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto --compare torch-compile+graph --precision bf16 --dtype bfloat16"
left=$((${T:-575} - SECONDS)); [ $left -gt 130 ] && { timeout $(( left < 280 ? left : 280 )) $B --batch 128 --onnx tests/onnx/models/convnext_tiny.onnx --json $R/a-onnx-convnext_tiny.json > $R/a.log 2>&1; echo "onnx convnext_tiny rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
left=$((${T:-575} - SECONDS)); [ $left -gt 120 ] && { timeout $left $B --model mobilenet_v2 --json $R/b-mobilenet_v2.json > $R/b.log 2>&1; echo "mobilenet_v2 rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
left=$((${T:-575} - SECONDS)); [ $left -gt 120 ] && { timeout $left $B --model efficientnet_b0 --json $R/c-efficientnet_b0.json > $R/c.log 2>&1; echo "efficientnet_b0 rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
