#!/bin/bash
# The checks that need a CUDA device, for a lent GPU machine (CI has none; docs/device-time.md):
# the C build, tests/*_gpu.py, `otel-train bench device`, then the whole suite on the device's
# host, test by test into $OUT so a run cut short still says which tests failed.
#
#   OUT=/tmp/out bash tests/gpu_checks.sh           # BROAD_S=0 skips the whole-suite run
#
# Packages the machine lacks travel as wheels in .whl/ (installed to /tmp/site when present).
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p "$O"
T0=$(date +%s)
stamp() { echo "== $1 at +$(( $(date +%s) - T0 )) s"; }
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || echo "installing .whl/ failed"
    export PYTHONPATH=/tmp/site:$PWD
fi
{
    stamp start
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
    timeout 150 python3 -c "from setuptools import setup; setup()" build_ext --inplace >"$O/build.log" 2>&1
    echo "C build rc $?"
    stamp gpu-tests
    timeout 200 python3 -m pytest -p no:cacheprovider -v -rfEs --timeout 150 tests/*_gpu.py 2>&1 | tail -60
    stamp bench-device
    timeout 120 python3 -m otel_train.cli bench device --steps 50 2>&1 | tail -25
    stamp gpu-done
} 2>&1 | tee "$O/gpu.log"
if [ "${BROAD_S:-240}" != 0 ]; then
    workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 12")
    timeout "${BROAD_S:-240}" python3 -m pytest -p no:cacheprovider -v -rfE $workers --timeout 100 tests \
        --ignore=tests/test_device_gpu.py --ignore=tests/test_detect_gpu.py >"$O/suite.log" 2>&1
    echo "suite rc $? ($(grep -c ' FAILED\| ERROR' "$O/suite.log") failed or errored lines)"
    grep ' FAILED\| ERROR' "$O/suite.log" | sed 's/^\[gw[0-9]*\] *\[ *[0-9]*%\] *//' | head -60
fi
