#!/usr/bin/env bash
# One-call GPU re-check of libvgpu after a change: SM 25/50/75 accuracy against an unlimited run, the
# 8000m memory limit as PyTorch sees it (default and cudaMallocAsync allocators), launch overhead and the
# MLP step with and without the interceptor. Prints JSON lines; results also under $OUT.
#   usage (device machine, repo root):  bash benchmarks/libvgpu_recheck.sh BENCH_DIR
set -u
bench=${1:-.devcarry/bench}; out=${OUT:-/tmp/libvgpu-out}; mkdir -p "$out"
make -s -C libvgpu >"$out/build.log" 2>&1 || { cat "$out/build.log"; exit 1; }
lib=$PWD/libvgpu/build/libvgpu.so; c=$(mktemp -d)
OUT=$out bash benchmarks/libvgpu_sm_sweep.sh "$bench" "250" "25 50 75" 6
for alloc in "" "backend:cudaMallocAsync"; do
  for p in meminfo oom; do
    PYTORCH_CUDA_ALLOC_CONF=$alloc CUDA_DEVICE_MEMORY_LIMIT=8000m CUDA_DEVICE_MEMORY_SHARED_CACHE=$c/m.cache \
      LD_PRELOAD=$lib python3 "$bench/torch_probe.py" $p --label "8000m${alloc:+-$alloc}" | tee -a "$out/recheck.jsonl"
    rm -f "$c/m.cache"
  done
done
nvcc -O2 "$bench/launch_bench.cu" -o "$c/lb" && for i in 1 2; do
  "$c/lb" 200000 | sed 's/^{/{"lib":"none",/' | tee -a "$out/recheck.jsonl"
  CUDA_DEVICE_MEMORY_SHARED_CACHE=$c/l.cache LD_PRELOAD=$lib "$c/lb" 200000 | sed 's/^{/{"lib":"ours",/' | tee -a "$out/recheck.jsonl"
done
python3 "$bench/torch_probe.py" train --label none | tee -a "$out/recheck.jsonl"
CUDA_DEVICE_MEMORY_SHARED_CACHE=$c/t.cache LD_PRELOAD=$lib python3 "$bench/torch_probe.py" train --label ours | tee -a "$out/recheck.jsonl"
