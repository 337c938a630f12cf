#!/usr/bin/env bash
# libvgpu memory path on a real GPU (the part of libvgpu_gpu.sh that the context charge
# touches): door check, PyTorch meminfo/OOM with the three allocator backends, the
# two-process test, and 16 processes starting at once.
#   usage (device machine, repo root): bash benchmarks/libvgpu_gpu_mem.sh BENCH_DIR
set -u
bench=${1:-.devcarry/bench}
out=${OUT:-/tmp/libvgpu-out}; mkdir -p "$out"
lib=$PWD/libvgpu/build/libvgpu.so
make -C libvgpu >"$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
c=$(mktemp -d)
LIBCUDA_LOG_LEVEL=4 CUDA_DEVICE_MEMORY_LIMIT=8000m CUDA_DEVICE_MEMORY_SHARED_CACHE=$c/a.cache LD_PRELOAD=$lib \
  python3 "$bench/torch_probe.py" meminfo 2>"$out/doors.log"
echo "{\"probe\":\"doors\",\"wrapped\":$(grep -c ': wrapped' "$out/doors.log"),\"unwrapped\":$(grep -c 'not an exported' "$out/doors.log")}"
grep -E 'context on device|not an exported' "$out/doors.log" | head -5
for conf in "" expandable_segments:True backend:cudaMallocAsync; do
  PYTORCH_CUDA_ALLOC_CONF=$conf CUDA_DEVICE_MEMORY_LIMIT=8000m CUDA_DEVICE_MEMORY_SHARED_CACHE=$c/be.cache LD_PRELOAD=$lib \
    python3 "$bench/torch_probe.py" oom --label "ctx-charged $conf" 2>/dev/null
  rm -f "$c/be.cache"
done
CUDA_DEVICE_MEMORY_LIMIT=8000m CUDA_DEVICE_MEMORY_SHARED_CACHE=$c/two.cache LD_PRELOAD=$lib \
  python3 benchmarks/libvgpu_two_proc.py --hold-mib 5000 --seconds 8 2>/dev/null
cc -O2 "$bench/alloc_bench.c" -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda -o "$c/alloc_bench"
for lib_ in none ours; do
  pre=""; [ $lib_ = ours ] && pre=$lib
  t0=$(date +%s%N)
  for k in $(seq 16); do
    LD_PRELOAD=$pre CUDA_DEVICE_MEMORY_LIMIT=8000m CUDA_DEVICE_MEMORY_SHARED_CACHE=$c/storm.cache "$c/alloc_bench" 100 >/dev/null 2>&1 &
  done
  wait
  echo "{\"probe\":\"storm16\",\"lib\":\"$lib_\",\"wall_ms\":$(( ($(date +%s%N) - t0) / 1000000 ))}"
done
rm -rf "$c"
