#!/usr/bin/env bash
# Thirtieth session, fourth device call: layer norm in one kernel (kernels.row_sweep, plan.ROW_SWEEP).
# Prediction (docs/performance.md): LayerNorm 1.00 -> ~0.61 ms, LayerNormBackwardData 1.46 -> ~0.91 ms
# of ConvNeXt-tiny's steps (bf16, batch 128), the step about 0.95 ms shorter than 26.25 ms.
. docs/results/h200-2026-12-05/device-setup.sh
timeout 150 python3 -m pytest tests/gpu/test_layer_norm_gpu.py -m gpu -q -rf -p no:cacheprovider -x > $R/t-ln.log 2>&1
rc=$?; echo "layer_norm_gpu rc=$rc $(grep -E 'passed|failed' $R/t-ln.log | tail -n 1) SECONDS=$SECONDS" >> $R/device.txt
[ $rc -eq 0 ] || { tar czf $OUT/call.tgz -C $R .; exit 0; }
timeout 100 python3 scripts/gpu_codegen_bench.py --model convnext_tiny --dtype bfloat16,float32 --row-sweep 0,1 --json $R/a-ln-bench.json > $R/a.log 2>&1
echo "ln bench rc=$? SECONDS=$SECONDS" >> $R/device.txt
M=tests/onnx/models/convnext_tiny.onnx
left=$((560 - SECONDS)); [ $left -gt 100 ] && { timeout $left opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto --compare torch-compile+graph --precision bf16 --dtype bfloat16 --batch 128 --onnx $M --json $R/b-convnext.json > $R/b.log 2>&1; echo "convnext rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
