#!/usr/bin/env bash
# The node monitor on a GPU machine: builds libvgpu, starts hami-vgpu-monitor (--backend nvidia)
# against an in-memory API server holding one pod on this node, runs a PyTorch process holding a
# known amount under libvgpu with a memory and SM limit, and prints the monitor's series next to
# `nvidia-smi --query-compute-apps` / `--query-gpu` while it idles, while it computes, and after
# kill -9. All output goes to $OUT (monitor_gpu.log, raw scrapes, monitor.log).
# Usage (repository root, GPU machine; Python deps of the repo and torch installed):
#   OUT=/tmp/monitor-gpu bash benchmarks/monitor_gpu.sh [HOLD_MIB] [LIMIT_MIB] [SM_PERCENT]
set -uo pipefail
cd "$(dirname "$0")/.."
HOLD=${1:-4096}; LIMIT=${2:-8000}; SM=${3:-30}
OUT=${OUT:-/tmp/monitor-gpu}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
{
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  $PY -c 'import torch; print("torch", torch.__version__)' 2>&1
  make -s -C libvgpu >"$OUT/build.log" 2>&1 || { echo "libvgpu build failed:"; cat "$OUT/build.log"; exit 2; }
  echo "libvgpu built: $(ls -l libvgpu/build/libvgpu.so | awk '{print $5}') bytes"
  $PY benchmarks/monitor_gpu.py --hold-mib "$HOLD" --limit-mib "$LIMIT" --sm "$SM" --out "$OUT"
  echo "exit $?"
} 2>&1 | tee "$OUT/monitor_gpu.log"
