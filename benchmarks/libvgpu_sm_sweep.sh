#!/usr/bin/env bash
# SM-limit accuracy sweep on a real GPU: matmul throughput under CUDA_DEVICE_SM_LIMIT for
# several slice lengths, alone and as two processes of one container; SM clock and power
# sampled alongside (the GPU boosts higher when duty-cycled, which raises work per busy ms).
#   usage (device machine, repo root): bash benchmarks/libvgpu_sm_sweep.sh BENCH_DIR "SLICES" "LIMITS" SECONDS
set -u
bench=${1:-.devcarry/bench}; slices=${2:-"20 100 250"}; limits=${3:-"50"}; secs=${4:-6}
out=${OUT:-/tmp/libvgpu-out}; mkdir -p "$out"
lib=$PWD/libvgpu/build/libvgpu.so
[ -f "$lib" ] || make -C libvgpu >"$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
c=$(mktemp -d)
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 250 >"$out/clocks.csv" 2>/dev/null &
smi=$!
python3 "$bench/torch_probe.py" matmul --seconds "$secs" --label base | tee -a "$out/sweep.jsonl"
for sl in $slices; do
  for sm in $limits; do
    LIBVGPU_SM_SLICE_MS=$sl CUDA_DEVICE_SM_LIMIT=$sm CUDA_DEVICE_MEMORY_SHARED_CACHE=$c/s$sl-$sm.cache LD_PRELOAD=$lib \
      python3 "$bench/torch_probe.py" matmul --seconds "$secs" --label "slice$sl-sm$sm" | tee -a "$out/sweep.jsonl"
  done
done
if [ -n "${PAIR_SLICE:-}" ]; then
  pids=()
  for k in 1 2; do
    LIBVGPU_SM_SLICE_MS=$PAIR_SLICE CUDA_DEVICE_SM_LIMIT=50 CUDA_DEVICE_MEMORY_SHARED_CACHE=$c/pair.cache LD_PRELOAD=$lib \
      python3 "$bench/torch_probe.py" matmul --seconds "$secs" --label "pair$k-slice$PAIR_SLICE-sm50" >>"$c/pair.jsonl" &
    pids+=($!)
  done
  wait "${pids[@]}"
  cat "$c/pair.jsonl" | tee -a "$out/sweep.jsonl"
fi
kill $smi 2>/dev/null
rm -rf "$c"
