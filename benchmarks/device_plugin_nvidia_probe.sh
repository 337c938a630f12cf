#!/usr/bin/env bash
# The device plugin with the nvidia backend (NVML) against the fake kubelet and the fake API server;
# prints the registration annotation, the ListAndWatch view, one Allocate and timings.
# Run from the repository root on the GPU machine:   bash benchmarks/device_plugin_nvidia_probe.sh
# Without a GPU (dry run):   bash benchmarks/device_plugin_nvidia_probe.sh --backend fake --fake-config CARDS.yaml
set -euo pipefail
cd "$(dirname "$0")/.."
python -c 'import grpc, pynvml, kubernetes, aiohttp, yaml, prometheus_client' 2>/dev/null || {
  echo "missing Python dependencies: pip install -e '.[test]' first" >&2; exit 2; }
nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not available)"
exec env PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" python benchmarks/device_plugin_nvidia_probe.py "$@"
