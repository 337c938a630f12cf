#!/usr/bin/env bash
# The whole legacy path by hand, without a cluster or a GPU: the in-memory API server, the device plugin
# (fake cards), the webhook, the scheduler extender and a kubelet-side gRPC Allocate, all on 127.0.0.1.
#
#     bash scripts/walkthrough.sh        # needs `pip install -e '.[test]'` (devcerts, jsonpatch, kubefakes)
#
# The blocks of "Try the whole legacy path by hand" in docs/testing.md are this script's steps, verbatim:
# every `step NAME` line below starts one, and tests/integration/test_walkthrough.py checks that the doc's
# blocks equal them, runs the script, and finds every output line the doc shows in the real output.
# Ports can be moved with API_PORT, WEBHOOK_PORT and EXTENDER_PORT (the test picks free ones); the
# scratch directory is made under $TMPDIR (default /tmp) and kept, with every server's log in it.
set -euo pipefail

# `step NAME` marks where a doc block starts; its "==> NAME" line lets the test cut the output per step.
step() { echo "==> $1"; }
# Stop what the steps started, also when a step fails half way.
cleanup() {
    kill ${EXT_PID-} ${WH_PID-} ${DP_PID-} ${API_PID-} 2>/dev/null || true
}
trap cleanup EXIT

step setup
W=$(mktemp -d "${TMPDIR:-/tmp}/hami-walk.XXXXXX") && cd "$W" && echo "scratch dir: $W"
API_PORT=${API_PORT:-18080}
WEBHOOK_PORT=${WEBHOOK_PORT:-18443}
EXTENDER_PORT=${EXTENDER_PORT:-18888}
API=http://127.0.0.1:$API_PORT
# Poll a command line until it succeeds (a server is up, an annotation is written), for at most 30 s.
wait_for() {
    for _ in $(seq 300); do eval "$1" > /dev/null 2>&1 && return 0; sleep 0.1; done
    echo "gave up waiting for: $1" >&2; return 1
}
# Print the annotations of an object of the API server, e.g. `annotations nodes/gpu-node-1`.
annotations() {
    curl -s "$API/api/v1/$1" |
        python -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["metadata"].get("annotations", {}), indent=1))'
}

step apiserver
python -m kubefakes.apiserver --port "$API_PORT" --kubeconfig-out "$W/kubeconfig" > api.log 2>&1 &
API_PID=$!
wait_for 'curl -sf "$API/api/v1/nodes"'
cat api.log

step node
cat > node.json <<'EOF'
{"apiVersion": "v1", "kind": "Node",
 "metadata": {"name": "gpu-node-1", "labels": {"kubernetes.io/hostname": "gpu-node-1"}},
 "status": {"capacity": {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "20"},
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "20"},
            "conditions": [{"type": "Ready", "status": "True"}]}}
EOF
curl -s -X POST -H 'Content-Type: application/json' --data @node.json "$API/api/v1/nodes" | python -m json.tool

step device-plugin
cat > cards.yaml <<'EOF'
cards:
  - {uuid: GPU-aaaa, index: 0, model: NVIDIA A100-SXM4-80GB, memory_mib: 81920, numa: 0}
  - {uuid: GPU-bbbb, index: 1, model: NVIDIA A100-SXM4-80GB, memory_mib: 81920, numa: 0}
EOF
mkdir -p device-plugins hook/vgpu
touch hook/vgpu/libvgpu.so hook/vgpu/ld.so.preload
hami-device-plugin --backend fake --fake-config cards.yaml --node-name gpu-node-1 \
    --kubeconfig kubeconfig --socket-dir "$W/device-plugins" \
    --hook-path "$W/hook" --metrics-port -1 > device-plugin.log 2>&1 &
DP_PID=$!
wait_for 'curl -s "$API/api/v1/nodes/gpu-node-1" | grep -q node-nvidia-register'
ls device-plugins
annotations nodes/gpu-node-1

step webhook
python -m webhook.devcerts --out "$W/certs"
hami-webhook --tls-cert-file certs/tls.crt --tls-private-key-file certs/tls.key \
    --address 127.0.0.1 --port "$WEBHOOK_PORT" > webhook.log 2>&1 &
WH_PID=$!
wait_for 'curl -sf --cacert certs/ca.crt "https://127.0.0.1:$WEBHOOK_PORT/healthz"'
cat webhook.log

step review
cat > review.json <<'EOF'
{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
 "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
             "kind": {"group": "", "version": "v1", "kind": "Pod"},
             "resource": {"group": "", "version": "v1", "resource": "pods"},
             "namespace": "default", "operation": "CREATE", "userInfo": {"username": "alice"},
             "object": {
               "apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "cuda-demo", "namespace": "default"},
               "spec": {"schedulerName": "default-scheduler",
                        "containers": [{"name": "main", "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                                        "command": ["nvidia-smi", "-L"],
                                        "resources": {
                                          "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3Gi",
                                                     "nvidia.com/gpucores": "30"},
                                          "requests": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3Gi",
                                                       "nvidia.com/gpucores": "30"}}}]}}}}
EOF
curl -s --cacert certs/ca.crt -H 'Content-Type: application/json' --data @review.json \
    "https://127.0.0.1:$WEBHOOK_PORT/mutate" > review-answer.json
cat review-answer.json; echo

step pod
python - <<'EOF'
import base64, json, jsonpatch
pod = json.load(open("review.json"))["request"]["object"]
answer = json.load(open("review-answer.json"))["response"]
patch = json.loads(base64.b64decode(answer["patch"]))
print(json.dumps(patch, indent=1))
json.dump(jsonpatch.apply_patch(pod, patch), open("pod.json", "w"))
EOF
curl -s -X POST -H 'Content-Type: application/json' --data @pod.json \
    "$API/api/v1/namespaces/default/pods" | python -m json.tool | grep -E '"(uid|schedulerName|nvidia.com/gpumem)"'

step extender
hami-scheduler-extender --kubeconfig kubeconfig --address 127.0.0.1 --port "$EXTENDER_PORT" > extender.log 2>&1 &
EXT_PID=$!
wait_for 'curl -sf "http://127.0.0.1:$EXTENDER_PORT/readyz"'
head -n 1 extender.log

step filter
curl -s "$API/api/v1/namespaces/default/pods/cuda-demo" |
    python -c 'import json, sys; print(json.dumps({"pod": json.load(sys.stdin), "nodenames": ["gpu-node-1"]}))' > filter-args.json
curl -s -H 'Content-Type: application/json' --data @filter-args.json "http://127.0.0.1:$EXTENDER_PORT/filter"; echo
annotations namespaces/default/pods/cuda-demo

step bind
POD_UID=$(curl -s "$API/api/v1/namespaces/default/pods/cuda-demo" | python -c 'import json, sys; print(json.load(sys.stdin)["metadata"]["uid"])')
curl -s -H 'Content-Type: application/json' \
    --data "{\"podName\": \"cuda-demo\", \"podNamespace\": \"default\", \"podUID\": \"$POD_UID\", \"node\": \"gpu-node-1\"}" \
    "http://127.0.0.1:$EXTENDER_PORT/bind"; echo
annotations namespaces/default/pods/cuda-demo
annotations nodes/gpu-node-1 | grep mutex.lock

step kubelet
cat > kubelet.py <<'EOF'
import asyncio, sys
from device_plugin.api import api_pb2 as pb
from kubefakes.kubelet import FakeKubelet

async def main(socket_dir):
    kubelet = FakeKubelet(socket_dir)  # serves <socket_dir>/kubelet.sock; the plugin sees it and registers
    await kubelet.start()
    plugin = await kubelet.wait_registered("nvidia.com/gpu", timeout=30)  # dialled back, ListAndWatch read
    print("registered", plugin.socket.name, "with", len(plugin.healthy()), "healthy devices")
    # What kubelet does to admit a container that asks for nvidia.com/gpu: 1.
    preferred = await plugin.stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
        pb.ContainerPreferredAllocationRequest(available_deviceIDs=sorted(plugin.healthy()), allocation_size=1)]))
    ids = list(preferred.container_responses[0].deviceIDs)
    print("preferred", ids)
    answer = await plugin.stub.Allocate(pb.AllocateRequest(container_requests=[
        pb.ContainerAllocateRequest(devices_ids=ids)]))
    container = answer.container_responses[0]
    for name, value in sorted(container.envs.items()):
        print(f"env {name}={value}")
    for m in container.mounts:
        print(f"mount {m.host_path} -> {m.container_path} ({'ro' if m.read_only else 'rw'})")
    await kubelet.stop()

asyncio.run(main(sys.argv[1]))
EOF
python kubelet.py "$W/device-plugins"

step after
annotations namespaces/default/pods/cuda-demo
curl -s "$API/api/v1/nodes/gpu-node-1" | python -c 'import json, sys; print(sorted(json.load(sys.stdin)["metadata"]["annotations"]))'
grep allocator device-plugin.log

step stop
kill $EXT_PID $WH_PID $DP_PID $API_PID
wait $EXT_PID $WH_PID $DP_PID $API_PID 2> /dev/null || true
echo "stopped; logs and files are in $W"
