# one call, in order of value: the GPU tests of code never run on a GPU, then the one missed target
# (tf32 ResNet-50, the stem's backward-filter over every cuDNN engine), then ResNet-50 from ONNX
. docs/results/h200-2026-12-05/device-setup.sh
END=${END:-555}
pip list 2>/dev/null | grep -iE "^(torch|cupy|onnx|onnxruntime|numpy) " >> $R/device.txt
for f in layer_norm_gpu copy_transpose_gpu models_gpu cuda_graph; do
  timeout 100 python3 -m pytest tests/gpu/test_$f.py -m gpu -q -rf -p no:cacheprovider --durations=3 > $R/t-$f.log 2>&1
  echo "$f rc=$? $(grep -E 'passed|failed|error' $R/t-$f.log | tail -n 1) SECONDS=$SECONDS" >> $R/device.txt
done
B="opgraph-bench --device cuda --warmup 5 --repeat 10 --cuda-graph --no-per-layer --layout nhwc --lowering auto --compare torch-compile+graph"
left=$((END - SECONDS)); timeout $(( left < 220 ? left : 220 )) $B --precision tf32 --dtype float32 --model resnet50 --policy docs/results/h200-2026-12-05/stem-all-engines.toml --json $R/a-tf32-resnet50-stem.json > $R/a.log 2>&1
echo "tf32 resnet50 stem-all-engines rc=$? SECONDS=$SECONDS" >> $R/device.txt
left=$((END - SECONDS)); [ $left -gt 60 ] && { timeout $left $B --precision bf16 --dtype bfloat16 --batch 128 --onnx tests/onnx/models/resnet50.onnx --json $R/b-onnx-resnet50.json > $R/b.log 2>&1; echo "onnx resnet50 bf16 rc=$? SECONDS=$SECONDS" >> $R/device.txt; }
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
