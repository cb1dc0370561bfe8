# Sourced by the prepared device calls (next-call*.sh), from the repository root on the device:
# the carried wheels into /tmp/site, the package in editable form, the autotune cache at
# $OPGRAPH_CACHE (seeded from .gl/cache.json.gz unless an earlier call of the same machine left
# one), the results folder $R and the device's name, driver and clocks in $R/device.txt.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export OPGRAPH_CACHE=/tmp/og-cache.json.gz
[ -f $OPGRAPH_CACHE ] || cp .gl/cache.json.gz $OPGRAPH_CACHE
R=$OUT/r; mkdir -p $R
(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv; date) > $R/device.txt
