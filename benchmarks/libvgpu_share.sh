#!/usr/bin/env bash
# One-call GPU measurement of card sharing with libvgpu: tenants as separate processes with their
# own per-container region (as separate containers), with and without the per-card region,
# PyTorch and JAX, 2 x 50 %, 30/30/40, priority; then launch overhead over many interleaved pairs.
# Prints JSON lines; everything also lands in $OUT/share.jsonl.
#   usage (device machine, repo root):  bash benchmarks/libvgpu_share.sh LIB [SECONDS] [PAIRS]
#   ONLY=<regex> runs only the groups whose label matches; TAG=<text> is appended to the labels;
#   other variables (LIBVGPU_PRIORITY_FLOOR, ...) pass through to every tenant.
set -u
lib=$(readlink -f "${1:?libvgpu.so to test}"); secs=${2:-10}; pairs=${3:-20}
out=${OUT:-/tmp/libvgpu-out}; mkdir -p "$out"; log=$out/share.jsonl
w=$(mktemp -d); cards=$w/cards; mkdir -p "$cards"
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1 | tr -d ' ')
echo "{\"bench\":\"env\",\"gpu_uuid\":\"$uuid\",\"glibc\":\"$(ldd --version | head -1)\",\"lib\":\"$lib\"}" | tee -a "$log"
probe=$PWD/benchmarks/libvgpu_tenant.py
export XLA_PYTHON_CLIENT_PREALLOCATE=false TF_CPP_MIN_LOG_LEVEL=3

# group FRAMEWORK CARD(0/1) LABEL SPEC... ; SPEC = sm:prio (sm "-" = no limit, "none" = no libvgpu)
group() {
  local fw=$1 card=$2 label=$3${TAG:-}; shift 3
  if [ -n "${ONLY:-}" ] && ! [[ $label =~ $ONLY ]]; then return; fi
  local i=0 pids=() sync=$w/sync.$label
  rm -f "$cards"/*.card; touch "$cards/$uuid.card"; mkdir -p "$sync"
  for spec in "$@"; do
    local sm=${spec%%:*} prio=${spec#*:}
    local e=(CUDA_DEVICE_MEMORY_LIMIT=30000m CUDA_TASK_PRIORITY=$prio CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/$label.$i.cache)
    [ "$sm" != "-" ] && [ "$sm" != none ] && e+=(CUDA_DEVICE_SM_LIMIT=$sm)
    [ "$card" = 1 ] && e+=(LIBVGPU_CARD_DIR=$cards)
    if [ "$sm" = none ]; then env "${e[@]}" python3 "$probe" --framework "$fw" --ready "$sync/r$i" --go "$sync/go" --seconds "$secs" --label "$label" >>"$w/g.out" 2>>"$w/err" &
    else env "${e[@]}" LD_PRELOAD="$lib" python3 "$probe" --framework "$fw" --ready "$sync/r$i" --go "$sync/go" --seconds "$secs" --label "$label" >>"$w/g.out" 2>>"$w/err" & fi
    pids+=($!); i=$((i+1))
  done
  for _ in $(seq 1200); do [ "$(ls "$sync" | grep -c '^r')" -ge "$#" ] && break; sleep 0.1; done
  touch "$sync/go"
  wait "${pids[@]}"; cat "$w/g.out" | tee -a "$log"; rm -f "$w/g.out"
  { echo "== $label"; cat "$w/err"; } >>"$out/stderr.log"
  [ -s "$w/err" ] && { grep -v "^$" "$w/err" | tail -3 | sed 's/"/'"'"'/g; s/^/{"stderr":"/; s/$/"}/' | tee -a "$log"; : >"$w/err"; }
}

for fw in torch jax; do
  group $fw 0 "$fw-alone-unlimited" none:1
  group $fw 1 "$fw-alone-50" 50:1
  group $fw 1 "$fw-2x50-card" 50:1 50:1
  group $fw 0 "$fw-2x50-nocard" 50:1 50:1
  group $fw 1 "$fw-30-30-40-card" 30:1 30:1 40:1
done
group torch 1 "torch-alone-high" -:0
group torch 1 "torch-high-vs-low50" -:0 50:1
group torch 1 "torch-alone-high60" 60:0
group torch 1 "torch-high60-vs-low60" 60:0 60:1

[ "$pairs" -gt 0 ] && { nvcc -O2 "${BENCH:-.devcarry/bench/gpu}/launch_bench.cu" -o "$w/lb" || exit 1; }
for i in $(seq "$pairs"); do
  "$w/lb" 200000 | sed 's/^{/{"lib":"none","pair":'"$i"',/' | tee -a "$log"
  CUDA_DEVICE_MEMORY_LIMIT=30000m CUDA_DEVICE_MEMORY_SHARED_CACHE=$w/l.cache LD_PRELOAD="$lib" "$w/lb" 200000 \
    | sed 's/^{/{"lib":"ours","pair":'"$i"',/' | tee -a "$log"
done
rm -rf "$w"
