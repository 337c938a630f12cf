"""Run the real device plugin with the `nvidia` backend against the fake kubelet and the fake API server.

For the GPU machine (issue 5, "On a real GPU"): one command that starts `kubefakes.apiserver` with a
Node object, the fake kubelet on a temp socket dir, and ``python -m device_plugin --backend nvidia`` as
a subprocess (the production entry point), then prints

- the registration annotation ``hami.io/node-nvidia-register`` (UUID, memory MiB, model, NUMA per card)
  and the handshake,
- what kubelet saw on ListAndWatch (virtual device count, health, topology),
- one Allocate for a pod prepared as the extender would (1 card, --mem MiB, --cores %), with env and mounts,
- timings: plugin start -> registered with kubelet, -> annotation written, Allocate round trip.

Usage: ``python benchmarks/device_plugin_nvidia_probe.py [--backend nvidia|fake] [--fake-config F]``.
Exit status 0 when the annotation was written and Allocate answered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hami import annotations as ann  # noqa: E402
from hami.kube import KubeClient  # noqa: E402
from hami.model import ContainerDevice  # noqa: E402
from hami.nodelock import lock_node  # noqa: E402
from hami.registration import decode_node_devices_json  # noqa: E402
from kubefakes.apiserver import FakeApiServer  # noqa: E402
from kubefakes.kubelet import FakeKubelet  # noqa: E402

NODE = "probe-node"
RESOURCE = "nvidia.com/gpu"


async def probe(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="dp-probe-"))
    hook = tmp / "hook"
    (hook / "vgpu").mkdir(parents=True)
    # Stand-ins: Allocate only checks that the host files exist; nothing is mounted here.
    (hook / "vgpu" / "libvgpu.so").write_text("probe placeholder")
    (hook / "vgpu" / "ld.so.preload").write_text(f"{hook}/vgpu/libvgpu.so\n")
    # NUMA TopologyInfo is off by default (as in HAMi); turn it on so the probe shows it.
    device_config = tmp / "device-config.yaml"
    device_config.write_text("nvidia:\n  enableNumaTopology: true\n")
    with FakeApiServer() as api:
        api.store.create("nodes", {"metadata": {"name": NODE}})
        kube = KubeClient.from_kubeconfig(api.kubeconfig_path)
        kubelet = FakeKubelet(tmp / "device-plugins")
        await kubelet.start()
        cmd = [
            sys.executable, "-m", "device_plugin", "--backend", args.backend, "--node-name", NODE,
            "--socket-dir", str(kubelet.socket_dir), "--kubeconfig", api.kubeconfig_path,
            "--hook-path", str(hook), "--device-config", str(device_config), "--metrics-port", "-1",
        ]  # fmt: skip
        if args.fake_config:
            cmd += ["--fake-config", args.fake_config]
        print("$", " ".join(cmd), flush=True)
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            try:
                ep = await kubelet.wait_registered(RESOURCE, timeout=60)
            except TimeoutError:
                proc.terminate()
                print(proc.communicate(timeout=10)[0])
                print("FAILED: the plugin did not register with the fake kubelet within 60 s")
                return 1
            t_reg = time.monotonic() - t0

            def annotated() -> bool:
                return ann.NVIDIA_REGISTER in ann.pod_annotations(api.store.get("nodes", NODE))

            await kubelet.wait_for(annotated, timeout=60)
            t_ann = time.monotonic() - t0
            annos = ann.pod_annotations(api.store.get("nodes", NODE))
            print(f"\n{ann.NVIDIA_REGISTER}: {annos[ann.NVIDIA_REGISTER]}")
            print(f"{ann.NVIDIA_HANDSHAKE}: {annos.get(ann.NVIDIA_HANDSHAKE)}")
            print("decoded:", json.dumps(json.loads(annos[ann.NVIDIA_REGISTER]), indent=2))
            for d in decode_node_devices_json(annos[ann.NVIDIA_REGISTER]):
                print(f"card {d.index}: uuid={d.uuid} devmem={d.devmem} MiB type={d.type!r} numa={d.numa} "
                      f"health={d.health} count={d.count} devcore={d.devcore}")  # fmt: skip
            health = sorted({d.health for d in ep.devices.values()})
            topo = sorted({tuple(n.ID for n in d.topology.nodes) for d in ep.devices.values()})
            print(f"\nListAndWatch: {len(ep.devices)} virtual devices, health {health}, NUMA topology {topo}")

            card = decode_node_devices_json(annos[ann.NVIDIA_REGISTER])[0]
            entry = [ContainerDevice(uuid=card.uuid, type="NVIDIA", usedmem=args.mem, usedcores=args.cores)]
            value = ann.encode_pod_devices([entry])
            pod = api.store.create(
                "pods",
                {
                    "metadata": {"name": "probe-pod", "namespace": "default",
                                 "annotations": {ann.ASSIGNED_NODE: NODE, ann.NVIDIA_TO_ALLOCATE: value,
                                                 ann.NVIDIA_ALLOCATED: value}},
                    "spec": {"schedulerName": "hami-scheduler",
                             "containers": [{"name": "main", "image": "cuda",
                                             "resources": {"limits": {RESOURCE: "1"}}}]},
                },
                keep_status=False,
            )  # fmt: skip
            lock_node(kube, NODE, namespace="default", pod_name="probe-pod")
            kube.patch_pod_metadata(
                "default",
                "probe-pod",
                annotations={ann.BIND_PHASE: "allocating", ann.BIND_TIME: str(int(time.time()))},
            )
            kube.bind_pod("default", "probe-pod", uid=pod["metadata"]["uid"], node=NODE)
            t1 = time.monotonic()
            ids, resp = await kubelet.admit_container(RESOURCE, 1)
            t_alloc = time.monotonic() - t1
            print(f"\nAllocate {ids}:")
            for k, v in sorted(resp.envs.items()):
                print(f"  env {k}={v}")
            for m in resp.mounts:
                print(f"  mount {m.host_path} -> {m.container_path} ({'ro' if m.read_only else 'rw'})")
            after = ann.pod_annotations(api.store.get("pods", "probe-pod", namespace="default"))
            if args.env_out:
                Path(args.env_out).write_text(json.dumps(dict(resp.envs), indent=2, sort_keys=True))
            print(
                f"  pod after: to-allocate={after[ann.NVIDIA_TO_ALLOCATE]!r} bind-phase={after[ann.BIND_PHASE]}"
            )
            print(f"\ntimings: registered {t_reg:.2f} s, annotation {t_ann:.2f} s after start; "
                  f"GetPreferredAllocation+Allocate {t_alloc * 1000:.1f} ms")  # fmt: skip
        finally:
            proc.terminate()
            out = proc.communicate(timeout=10)[0]
            await kubelet.stop()
        print("\nplugin log (last 20 lines):")
        print("\n".join(out.splitlines()[-20:]))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="nvidia", choices=("nvidia", "fake"))
    parser.add_argument("--fake-config", help="CARDS.yaml for --backend fake (a dry run without a GPU)")
    parser.add_argument("--mem", type=int, default=1000, help="MiB the prepared pod gets on the card")
    parser.add_argument("--cores", type=int, default=10, help="percent of SMs the prepared pod gets")
    parser.add_argument("--env-out", help="write the Allocate response's env as JSON to this file")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(Path(__file__).resolve().parent.parent))
    return asyncio.run(probe(args))


if __name__ == "__main__":
    sys.exit(main())
