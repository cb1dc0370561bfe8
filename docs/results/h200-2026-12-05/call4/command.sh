#!/usr/bin/env bash
# device call 4 (twenty-second session), on the machine call 3 left warm (same tree, /tmp/site from call 3):
# call 3's test_fuse_gpu.py run was cut by its time limit (220 s left), so the file again, alone
export PYTHONPATH=/tmp/site; timeout 280 python3 -m pytest tests/gpu/test_fuse_gpu.py -m gpu -q -rf -p no:cacheprovider -x --durations=5 2>&1 | tail -n 15
