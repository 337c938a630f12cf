#!/usr/bin/env bash
# libvgpu on a real GPU: build, then every probe, one JSON line each (also into $OUT/).
#   usage (device machine, repo root): bash benchmarks/libvgpu_gpu.sh BENCH_DIR
# BENCH_DIR holds ../shared/bench/gpu (compare.sh, torch_probe.py, ...).
set -u
bench=${1:-.devcarry/bench}
out=${OUT:-/tmp/libvgpu-out}; mkdir -p "$out"
lib=$PWD/libvgpu/build/libvgpu.so
make -C libvgpu >"$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
c=$(mktemp -d)
# 1. door check: how many driver entry points reached through cuGetProcAddress/dlsym were wrapped
LIBCUDA_LOG_LEVEL=4 CUDA_DEVICE_MEMORY_LIMIT=8000m CUDA_DEVICE_MEMORY_SHARED_CACHE=$c/a.cache LD_PRELOAD=$lib \
  python3 "$bench/torch_probe.py" meminfo 2>"$out/doors.log"
echo "{\"probe\":\"doors\",\"wrapped\":$(grep -c ': wrapped' "$out/doors.log"),\"unwrapped\":$(grep -c 'not an exported' "$out/doors.log")}"
grep 'not an exported' "$out/doors.log" | head -5
# 2. the shared comparison (none vs ours)
bash "$bench/compare.sh" ours="$lib" 2>&1 | tee "$out/compare.jsonl"
# 3. SM 75 (compare.sh runs 100/50/25)
for sm in 75; do
  CUDA_DEVICE_SM_LIMIT=$sm CUDA_DEVICE_MEMORY_SHARED_CACHE=$c/sm$sm.cache LD_PRELOAD=$lib \
    python3 "$bench/torch_probe.py" matmul --seconds 8 --label sm$sm | tee -a "$out/extra.jsonl"
done
# 3b. the other PyTorch allocator backends: VMM (cuMemCreate) and stream-ordered (cuMemAllocAsync)
for conf in expandable_segments:True backend:cudaMallocAsync; do
  PYTORCH_CUDA_ALLOC_CONF=$conf CUDA_DEVICE_MEMORY_LIMIT=8000m CUDA_DEVICE_MEMORY_SHARED_CACHE=$c/be.cache LD_PRELOAD=$lib \
    python3 "$bench/torch_probe.py" oom --label "$conf" | tee -a "$out/extra.jsonl"
  rm -f $c/be.cache
done
# 4. two processes, one container (shared cache), limit 8000m
CUDA_DEVICE_MEMORY_LIMIT=8000m CUDA_DEVICE_MEMORY_SHARED_CACHE=$c/two.cache LD_PRELOAD=$lib \
  python3 benchmarks/libvgpu_two_proc.py --hold-mib 5000 --seconds 8 | tee -a "$out/extra.jsonl"
# 5. two processes sharing SM 50 (container-wide budget): each runs the matmul probe at once
for k in 1 2; do
  CUDA_DEVICE_SM_LIMIT=50 CUDA_DEVICE_MEMORY_SHARED_CACHE=$c/sm2.cache LD_PRELOAD=$lib \
    python3 "$bench/torch_probe.py" matmul --seconds 8 --label sm50-pair$k >>"$out/pair.jsonl" &
done
wait; cat "$out/pair.jsonl" | tee -a "$out/extra.jsonl"
rm -rf "$c"
