#!/usr/bin/env bash
# End to end on a GPU node: the device plugin (nvidia backend, NVML) registers the real card, answers
# Allocate for a pod the extender placed (--mem MiB, --cores %), and that exact env is applied, with
# libvgpu.so preloaded, to a PyTorch process. Prints what PyTorch sees and where it hits OOM / how fast
# a matmul runs, next to an unlimited run.
# Usage (repository root, GPU machine):  bash benchmarks/node_path_gpu.sh [MEM_MIB] [CORES] [OUTDIR]
set -uo pipefail
cd "$(dirname "$0")/.."
MEM=${1:-8000}; CORES=${2:-30}; OUT=${3:-${OUT:-/tmp/node-path}}
mkdir -p "$OUT"
make -s -C libvgpu >/dev/null || { echo "libvgpu build failed" >&2; exit 2; }
LIB=$PWD/libvgpu/build/libvgpu.so
PROBE=${TORCH_PROBE:-benchmarks/gpu/torch_probe.py}
python3 benchmarks/device_plugin_nvidia_probe.py --backend nvidia --mem "$MEM" --cores "$CORES" \
  --env-out "$OUT/allocate_env.json" > "$OUT/plugin_probe.log" 2>&1
echo "device plugin probe exit $?"; grep -E "hami.io/node-nvidia-register:|^card |^  env |^timings" "$OUT/plugin_probe.log"
# The cache file lives in the container's own dir; outside a container, use a temp path.
CACHE=$(mktemp -u /tmp/vgpu-XXXX.cache)
ENVS=$(python3 - "$OUT/allocate_env.json" "$CACHE" <<'PY'
import json, shlex, sys
env = json.load(open(sys.argv[1]))
env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = sys.argv[2]
print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k != "NVIDIA_VISIBLE_DEVICES"))
PY
)
echo "applied env: $ENVS"
for probe in meminfo oom "matmul --seconds 6"; do
  base=$(python3 "$PROBE" $probe 2>/dev/null | tail -1)
  lim=$(eval env $ENVS LD_PRELOAD="$LIB" python3 "$PROBE" $probe 2>>"$OUT/limited_stderr.log" | tail -1)
  echo "$probe: unlimited=$base limited=$lim"
done
