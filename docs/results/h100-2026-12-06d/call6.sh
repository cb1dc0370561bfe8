#!/usr/bin/env bash
# Thirtieth session, sixth device call: packed column operands loaded as 16-byte words
# (emit._col_vector). Prediction (docs/performance.md): bf16 LayerNorm 0.894 -> ~0.70 ms,
# LayerNormBackwardData 1.05 -> ~0.95, bias + GELU chains 2.62 -> ~2.45, ConvNeXt-tiny 25.9 -> ~25.4 ms.
. docs/results/h200-2026-12-05/device-setup.sh
timeout 120 python3 -m pytest tests/gpu/test_layer_norm_gpu.py tests/gpu/test_codegen_gpu.py -m gpu -q -rf -p no:cacheprovider \
  -k "layer_norm or LayerNorm or trailing or bias_" > $R/t-gpu.log 2>&1
rc=$?; echo "gpu tests rc=$rc $(grep -E 'passed|failed' $R/t-gpu.log | tail -n 1) SECONDS=$SECONDS" >> $R/device.txt
[ $rc -eq 0 ] || { tar czf $OUT/call.tgz -C $R .; exit 0; }
timeout 60 python3 scripts/gpu_codegen_bench.py --model convnext_tiny --dtype bfloat16,float32 --row-sweep 1 --unroll 1 --json $R/a-ln-bench.json > $R/a.log 2>&1
echo "ln bench rc=$? SECONDS=$SECONDS" >> $R/device.txt
M=tests/onnx/models/convnext_tiny.onnx
left=$((330 - SECONDS)); [ $left -gt 100 ] && { timeout $left opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto --compare torch-compile+graph --precision bf16 --dtype bfloat16 --batch 128 --onnx $M --json $R/b-convnext.json > $R/b.log 2>&1; echo "convnext rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
left=$((380 - SECONDS)); [ $left -gt 20 ] && { timeout $left opgraph-bench --profile --onnx $M --batch 128 --dtype bfloat16 --precision bf16 --layout nhwc --json $R/c-profile-convnext.json > $R/c.log 2>&1; echo "profile rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
