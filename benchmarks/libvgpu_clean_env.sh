#!/usr/bin/env bash
# A process started without the container's environment is limited by the config file beside the
# library, on a real GPU: the library and its vgpu.config are installed as the device plugin
# mounts them, then PyTorch probes run under `env -i` with only the loader's variables (LD_PRELOAD
# standing for /etc/ld.so.preload, LD_LIBRARY_PATH for ld.so.conf, PATH). Also counts the
# lazily loaded kernels libvgpu charged (CUDA 12.2+ loads modules lazily by default).
#   usage (device machine, repo root):  bash benchmarks/libvgpu_clean_env.sh LIB BENCH_DIR
set -u
lib=$(readlink -f "${1:?libvgpu.so}"); bench=${2:?torch_probe.py directory}; out=${OUT:-/tmp/libvgpu-out}
mkdir -p "$out"; log=$out/clean_env.jsonl
d=$(mktemp -d); mkdir -p "$d/vgpu"; cp "$lib" "$d/vgpu/libvgpu.so"
py=$(command -v python3)
cat >"$d/vgpu/vgpu.config" <<CFG
vgpu-config 1
CUDA_DEVICE_MEMORY_LIMIT_0=8000m
CUDA_DEVICE_MEMORY_SHARED_CACHE=$d/vgpu/ctr.cache
CUDA_DEVICE_SM_LIMIT=0
CFG
clean() { env -i PATH="$PATH" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" LD_PRELOAD="$d/vgpu/libvgpu.so" "$@"; }
for p in meminfo oom; do
  clean "$py" "$bench/torch_probe.py" $p --label "env-i+config" 2>>"$out/clean_env.err" | tee -a "$log"
done
# the container's own process (environment set) holds 4000 MiB; a scrubbed sibling shares its limit
CUDA_DEVICE_MEMORY_LIMIT_0=8000m CUDA_DEVICE_MEMORY_SHARED_CACHE=$d/vgpu/ctr.cache LD_PRELOAD="$d/vgpu/libvgpu.so" \
  "$py" -c 'import torch,time,sys; x=torch.empty(4000<<20,dtype=torch.uint8,device="cuda"); print("held",flush=True); time.sleep(60)' \
  >"$d/holder.out" 2>>"$out/clean_env.err" &
hp=$!
for _ in $(seq 600); do grep -q held "$d/holder.out" 2>/dev/null && break; sleep 0.1; done
clean "$py" "$bench/torch_probe.py" oom --label "env-i+config, sibling holds 4000 MiB" 2>>"$out/clean_env.err" | tee -a "$log"
kill $hp; wait $hp 2>/dev/null
# without the file the same clean process is unlimited, and says so once
rm "$d/vgpu/vgpu.config"
clean "$py" "$bench/torch_probe.py" meminfo --label "env-i, no config" 2>"$d/nofile.err" | tee -a "$log"
echo "{\"probe\":\"no-config-warning\",\"lines\":$(grep -c 'NOT limited' "$d/nofile.err")}" | tee -a "$log"
# lazily loaded kernels charged during a PyTorch matmul run (default lazy loading)
CUDA_DEVICE_MEMORY_LIMIT=8000m CUDA_DEVICE_MEMORY_SHARED_CACHE=$d/lazy.cache LIBCUDA_LOG_LEVEL=4 LD_PRELOAD="$lib" \
  "$py" "$bench/torch_probe.py" matmul --seconds 2 --label lazy 2>"$d/lazy.err" | tee -a "$log"
echo "{\"probe\":\"lazy-charges\",\"module_loads_charged\":$(grep -c 'module 0x.* charged' "$d/lazy.err"),\"lazy_kernel_charges\":$(grep -c 'lazily loaded kernels charged' "$d/lazy.err"),\"bytes\":$(grep -o 'lazily loaded kernels charged [0-9]*' "$d/lazy.err" | awk '{s+=$5} END {print s+0}')}" | tee -a "$log"
rm -rf "$d"
