#!/usr/bin/env bash
# The compute limiter's and interceptor's H200 targets in one call (docs/benchmarks.md, run 14).
#   usage (device machine, repository root):  bash benchmarks/libvgpu_final_h200.sh [SECONDS]
# Builds libvgpu there (make -C libvgpu), and HAMi-core from ./hami-core if that folder is there
# (upstream source carried along: the machine reaches nothing outside), in the background while the
# shares run. Then benchmarks/libvgpu_limits.py, most important first (partial results survive a
# timeout: every record is appended to $OUT/limits.jsonl as it comes):
#   sparse   - 50 % and 25 % tenants beside a tiny kernel every 50 ms
#   shares   - the unlimited reference pair, 50 beside unlimited, 25 + 75, 4 x 25, 4 streams vs 1 at 50/50
#   accuracy - alone at 10/20/30/50/70/90 % (MAE after the first second; first work at 10 %)
#   chain    - 15 chained 200 ms processes of one container at 20 %
#   overhead - launch overhead over interleaved pairs vs no interceptor; cuMemAlloc/Free pairs vs
#              HAMi-core with its limit in force (CUDA_DEVICE_MEMORY_LIMIT and _0 = 8000m)
#   start    - 64 processes starting at once, each its own container, p50 vs no interceptor
# BENCH names the folder of launch_bench.cu and alloc_bench.c (default ./bench_gpu).
set -u
secs=${1:-4}
out=${OUT:-/tmp/libvgpu-out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 OUT=$out
{ nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm --format=csv,noheader; uptime; } | tee "$out/gpu.txt"
make -C libvgpu >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
if [ -d hami-core ]; then
  ( cd hami-core && mkdir -p build && cd build && nice -n 19 cmake .. -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
      -DCMAKE_BUILD_TYPE=Release -DDLSYM_HOOK_ENABLE=1 -DMULTIPROCESS_LIMIT_ENABLE=1 -DHOOK_MEMINFO_ENABLE=1 \
      -DHOOK_NVML_ENABLE=1 >"$out/hami_build.log" 2>&1 && nice -n 19 make -j8 >>"$out/hami_build.log" 2>&1 ) &
  hami_pid=$!
fi
run() { BENCH=${BENCH:-$PWD/bench_gpu} python3 benchmarks/libvgpu_limits.py --lib libvgpu/build/libvgpu.so \
          --seconds "$secs" "$@" 2>>"$out/stderr.log"; }
t0=$(date +%s)
run --only sparse,shares,accuracy,chain
echo "shares done after $(( $(date +%s) - t0 )) s"
hami=""
if [ -n "${hami_pid:-}" ]; then wait "$hami_pid"; hami=$(ls hami-core/build/libvgpu.so 2>/dev/null); fi
echo "hami=${hami:-none (build log: $(tail -3 "$out/hami_build.log" 2>/dev/null))}"
run --only overhead,start --pairs 20 --launches 100000 --launch-libs none,ours --storm-runs 1 ${hami:+--hami $hami}
echo "all done after $(( $(date +%s) - t0 )) s"
grep '"summary"' "$out/limits.jsonl"
tail -5 "$out/stderr.log"
