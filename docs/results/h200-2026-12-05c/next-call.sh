#!/usr/bin/env bash
# Prepared in the twenty-sixth session (no device lent) for the next session's FIRST call; then
# docs/results/h200-2026-12-05b/next-call.sh, h200-2026-12-05/next-call-2.sh and next-call-3.sh.
# Copy to .gl/ with the cache docs/results/h200-2026-12-05/autotune-cache.json.gz at .gl/cache.json.gz;
# carry [".whl", ".gl"].
# What changed: a reduction's thread loads ROW_LOAD_BYTES (32) of its run per iteration
# (codegen/plan.py, both layouts): the batch-norm statistics, bias gradients, global pools and the
# other single-load reductions now load two steps at a time, anything read one element a lane up to
# four; the aligned backward sums (two 16-byte words a step) keep their text.
# (1) The generated kernels' GPU tests (the changed reductions: test_steps_loaded_per_iteration_*
# checks the same bits as one step at a time, as NVRTC compiles them; the CPU emulator checked g++'s).
# (2) gpu_codegen_bench.py on ResNet-50's batch-norm shapes, fp32 and bf16, ROW_LOAD_BYTES 0 and 32,
# against the prediction in docs/performance.md ("Rows in flight"). (3) tf32 ResNet-50 beside
# torch-compile+graph (1.011x, the one missed time target), then bf16 ResNet-50 beside it.
. docs/results/h200-2026-12-05/device-setup.sh  # wheels, package, cache, $R, device.txt
for f in codegen_gpu layer_norm_gpu; do
  timeout 170 python3 -m pytest tests/gpu/test_$f.py -m gpu -q -rf -p no:cacheprovider > $R/t-$f.log 2>&1
  echo "$f rc=$? $(grep -E 'passed|failed|error' $R/t-$f.log | tail -n 1) SECONDS=$SECONDS" >> $R/device.txt
done
for dt in float32 bfloat16; do
  timeout 90 python3 scripts/gpu_codegen_bench.py --dtype $dt --blocks 528 --unroll 1 --row-bytes 0,32 \
    --json $R/a-codegen-bench-resnet50-$dt.json > $R/a-$dt.log 2>&1
  echo "codegen-bench $dt rc=$? SECONDS=$SECONDS" >> $R/device.txt
done
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto --compare torch-compile+graph --model resnet50"
left=$((575 - SECONDS)); [ $left -gt 120 ] && { timeout $(( left < 240 ? left : 240 )) $B --precision tf32 --dtype float32 --json $R/b-tf32-resnet50.json > $R/b.log 2>&1; echo "tf32 resnet50 rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
left=$((575 - SECONDS)); [ $left -gt 120 ] && { timeout $left $B --precision bf16 --dtype bfloat16 --json $R/c-bf16-resnet50.json > $R/c.log 2>&1; echo "bf16 resnet50 rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
