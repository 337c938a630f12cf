#!/usr/bin/env bash
# MPS against libvgpu's time-slicing on one card, all in one run: an unlimited tenant alone and an
# unlimited pair (no libvgpu, no MPS), libvgpu's SM limiter at 2 x 50 % and 30/30/40 (with the
# per-card region, as the device plugin sets it up), then an MPS control daemon started as a plain
# process with its own pipe and log directories (the card's compute mode and MIG mode are left as
# they are) and the same shares through CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, libvgpu preloaded as the
# memory accountant only (no SM limit), as the device plugin's mps mode gives containers.
# Tenants are separate processes (separate containers in production): benchmarks/libvgpu_tenant.py,
# 8192^2 bf16 matmuls, measured over the same window once every tenant is warm.
# Prints JSON lines; everything also lands in $OUT/mps.jsonl.
#   usage (device machine, repo root):  bash benchmarks/mps_share.sh [SECONDS] [BENCH_DIR]
# BENCH_DIR holds ../shared/bench/gpu (torch_probe.py) for the memory probes.
set -u
secs=${1:-8}; bench=${2:-.dev25/bench}
out=${OUT:-/tmp/mps-out}; mkdir -p "$out"; log=$out/mps.jsonl
say() { echo "$1" | tee -a "$log"; }
make -C libvgpu >"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
lib=$PWD/libvgpu/build/libvgpu.so
w=$(mktemp -d); cards=$w/cards; mkdir -p "$cards"
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1 | tr -d ' ')
q=$(nvidia-smi --query-gpu=name,driver_version,compute_mode,mig.mode.current --format=csv,noheader | head -1)
ctl=$(command -v nvidia-cuda-mps-control || echo "")
say "{\"bench\":\"env\",\"gpu\":\"$q\",\"mps_control\":\"$ctl\",\"load\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"nproc\":$(nproc)}"
probe=$PWD/benchmarks/libvgpu_tenant.py
mps_env=(CUDA_MPS_PIPE_DIRECTORY=$w/mps-pipe CUDA_MPS_LOG_DIRECTORY=$w/mps-log)

# group MODE LABEL SPEC... ; MODE none (plain) | slice (libvgpu SM limit) | mps (MPS + libvgpu memory);
# SPEC = percent ("-" = no limit)
group() {
  local mode=$1 label=$2; shift 2
  local i=0 pids=() sync=$w/sync.$label
  rm -f "$cards"/*.card; touch "$cards/$uuid.card"; mkdir -p "$sync"
  for pct in "$@"; do
    local e=(CUDA_TASK_PRIORITY=1)
    case $mode in
      slice) e+=(LD_PRELOAD=$lib CUDA_DEVICE_MEMORY_LIMIT=30000m LIBVGPU_CARD_DIR=$cards
                 CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/$label.$i.cache)
             [ "$pct" != - ] && e+=(CUDA_DEVICE_SM_LIMIT=$pct) ;;
      mps) e+=(LD_PRELOAD=$lib CUDA_DEVICE_MEMORY_LIMIT=30000m CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/$label.$i.cache
               "${mps_env[@]}" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=30000M)
           [ "$pct" != - ] && e+=(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct) ;;
    esac
    env "${e[@]}" python3 "$probe" --ready "$sync/r$i" --go "$sync/go" --seconds "$secs" --label "$label:$pct" \
      >>"$w/g.out" 2>>"$w/err" &
    pids+=($!); i=$((i+1))
  done
  for _ in $(seq 900); do [ "$(ls "$sync" | grep -c '^r')" -ge "$#" ] && break; sleep 0.1; done
  touch "$sync/go"
  wait "${pids[@]}"; sed "s/^{/{\"mode\":\"$mode\",/" "$w/g.out" | tee -a "$log"; rm -f "$w/g.out"
  if [ -s "$w/err" ]; then
    { echo "== $label"; cat "$w/err"; } >>"$out/stderr.log"
    grep -v "^$" "$w/err" | tail -2 | sed 's/"/'"'"'/g; s/^/{"stderr":"/; s/$/"}/' | tee -a "$log"; : >"$w/err"
  fi
}

# memory a process sees: libvgpu alone, libvgpu under MPS, MPS's own pinned limit alone
meminfo() {
  local label=$1; shift
  env "$@" python3 "$bench/torch_probe.py" meminfo 2>>"$out/stderr.log" | sed "s/^{/{\"bench\":\"meminfo\",\"label\":\"$label\",/" | tee -a "$log"
}

group none alone-unlimited -
if [ -z "${MPS_ONLY:-}" ]; then  # MPS_ONLY=1: the reference tenant and the MPS groups alone
  group none pair-unlimited - -
  group slice slice-2x50 50 50
  group slice slice-30-30-40 30 30 40
  meminfo slice-8000m LD_PRELOAD=$lib CUDA_DEVICE_MEMORY_LIMIT=8000m CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/m1.cache
fi

if [ -z "$ctl" ]; then
  say '{"bench":"mps","error":"nvidia-cuda-mps-control is not on the PATH"}'
else
  mkdir -p "$w/mps-pipe" "$w/mps-log"
  env "${mps_env[@]}" nvidia-cuda-mps-control -d >"$out/mps-start.log" 2>&1; rc=$?
  say "{\"bench\":\"mps-start\",\"rc\":$rc,\"output\":\"$(tr '\n"' ' \x27' <"$out/mps-start.log")\"}"
  if [ $rc = 0 ]; then
    group mps mps-alone-unlimited -
    group mps mps-pair-unlimited - -
    group mps mps-2x50 50 50
    group mps mps-30-30-40 30 30 40
    meminfo mps-libvgpu-8000m LD_PRELOAD=$lib CUDA_DEVICE_MEMORY_LIMIT=8000m \
      CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/m2.cache "${mps_env[@]}" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8000M
    meminfo mps-pinned-8000m "${mps_env[@]}" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8000M
    echo get_server_list | env "${mps_env[@]}" nvidia-cuda-mps-control >"$out/mps-servers.log" 2>&1
    echo quit | env "${mps_env[@]}" nvidia-cuda-mps-control >>"$out/mps-start.log" 2>&1
    say "{\"bench\":\"mps-stop\",\"rc\":$?,\"servers\":\"$(tr '\n' ' ' <"$out/mps-servers.log")\"}"
  fi
  cat "$w"/mps-log/*.log >"$out/mps-daemon.log" 2>/dev/null
fi
say "{\"bench\":\"end\",\"compute_mode\":\"$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader | head -1)\",\"load\":\"$(cut -d' ' -f1-3 /proc/loadavg)\"}"
rm -rf "$w"
