. docs/results/h200-2026-12-05/device-setup.sh
pip list 2>/dev/null | grep -iE "^(torch|cupy|onnx|onnxruntime|nvidia-cudnn|numpy) " >> $R/device.txt
for f in codegen_gpu pool_scan_gpu relu_bias_sums_gpu capture_gpu fuse_gpu profile_gpu \
         zero_copy_pool_gpu bf16_kernels memory_gpu held_stream_gpu device_resolution reference_pool_cupy \
         cudnn_fusion cudnn cudnn_batchnorm cublas_matmul_gpu cuda_kernels depthwise_gpu depthwise_wgrad_gpu \
         unfold_gpu peers_gpu pool_vector_gpu; do
  left=$((400 - SECONDS)); [ $left -lt 15 ] && { echo "$f not run: out of time" >> $R/device.txt; continue; }
  lim=$(( left < 170 ? left : 170 ))
  timeout $lim python3 -m pytest tests/gpu/test_$f.py -m gpu -q -rf -p no:cacheprovider --durations=3 > $R/t-$f.log 2>&1
  echo "$f rc=$? $(grep -E 'passed|failed|error' $R/t-$f.log | tail -n 1) SECONDS=$SECONDS" >> $R/device.txt
done
cp $OPGRAPH_CACHE $OUT/autotune-cache.json.gz
tar czf $OUT/call.tgz -C $R .
