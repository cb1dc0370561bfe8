#!/usr/bin/env bash
# device call 5 (twenty-second session), the last 168 s of the session's device time, machine still warm
export PYTHONPATH=/tmp/site; for f in pool_vector_gpu zero_copy_pool_gpu cuda_graph capture_gpu; do timeout 35 python3 -m pytest tests/gpu/test_$f.py -m gpu -q -p no:cacheprovider 2>&1 | tail -n 1; echo "$f rc=$?"; done
