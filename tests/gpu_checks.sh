#!/bin/bash
# The checks that need a CUDA device, for a lent GPU machine (CI has none; docs/device-time.md),
# in one run of about 7 minutes: the C build, what one CUDA event call costs (the constants the
# CPU proxy of `bench overhead --device-path` stands in with), tests/*_gpu.py (the no-sync loop
# within 1 % among them), then the launch-bound loop of issue 51 itself: plain, automatic,
# automatic with device timing off, explicit spans and hand-written SDK spans, each in fresh
# processes, interleaved (`otel-train bench overhead --device-path`); optionally the whole suite.
#
#   OUT=/tmp/out bash tests/gpu_checks.sh       # BROAD_S=240 adds the whole suite (off by default)
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
    stamp event-call-costs
    timeout 60 python3 - <<'EOF'
# Host µs a call, the CPU proxy's constants (otel_train/bench/device_path.py): replace its estimates.
import time, torch
torch.cuda.init()
x = torch.ones(1, device="cuda")
def per_call(fn, n=20000):
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n / 1e3
for name, make in (("torch.Event", lambda: torch.Event(device=torch.device("cuda"), enable_timing=True)),
                   ("torch.cuda.Event", lambda: torch.cuda.Event(enable_timing=True))):
    print(f"event_create_us[{name}]: {per_call(make, 5000):.3f}")
    a, b = make(), make()
    print(f"event_record_us[{name}]: {per_call(a.record):.3f}")
    b.record(); torch.cuda.synchronize()  # the check's own sync: completed events below
    print(f"event_query_us[{name}]: {per_call(b.query):.3f}")
    print(f"event_elapsed_time_us[{name}]: {per_call(lambda: a.elapsed_time(b)):.3f}")
print(f"capture_check_us: {per_call(torch._C._cuda_isCurrentStreamCapturing):.3f}")
EOF
    stamp gpu-tests
    timeout 240 python3 -m pytest -p no:cacheprovider -v -rfEs --timeout 150 tests/*_gpu.py 2>&1 | tail -60
    stamp device-path
    timeout 330 python3 -m otel_train.cli bench overhead --device-path 3 2>&1 | tail -45
    stamp gpu-done
} 2>&1 | tee "$O/gpu.log"
if [ "${BROAD_S:-0}" != 0 ]; then
    workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n 12")
    timeout "${BROAD_S}" python3 -m pytest -p no:cacheprovider -v -rfE $workers --timeout 100 tests \
        --ignore=tests/test_device_gpu.py --ignore=tests/test_detect_gpu.py >"$O/suite.log" 2>&1
    echo "suite rc $? ($(grep -c ' FAILED\| ERROR' "$O/suite.log") failed or errored lines)"
    grep ' FAILED\| ERROR' "$O/suite.log" | sed 's/^\[gw[0-9]*\] *\[ *[0-9]*%\] *//' | head -60
fi
