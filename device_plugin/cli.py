"""The ``hami-device-plugin`` command: flags and environment -> `DevicePluginApp`, run until SIGTERM/SIGINT.

Precedence: flag, then environment variable, then device config file, then built-in default.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from device_plugin.api import DEFAULT_SOCKET_DIR
from device_plugin.backends import BACKENDS, make_backend
from hami.errors import HamiError


def build_parser() -> argparse.ArgumentParser:
    """The command line; each flag's default is its environment variable (see docs/device-plugin.md)."""
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="hami-device-plugin",
        description="HAMi legacy-mode NVIDIA device plugin (kubelet device plugin API v1beta1).",
    )
    p.add_argument("--node-name", default=env("NODE_NAME"), help="this node's name (env NODE_NAME; required)")
    p.add_argument(
        "--device-config",
        default=env("CONFIG_FILE"),
        help="device-config.yaml shared with the scheduler (env CONFIG_FILE); default: built-in defaults",
    )
    p.add_argument(
        "--resource-name",
        default=env("RESOURCE_NAME"),
        help="resource to advertise; default nvidia.resourceCountName of the device config (nvidia.com/gpu)",
    )
    p.add_argument(
        "--socket-dir",
        default=env("DEVICE_PLUGIN_DIR", DEFAULT_SOCKET_DIR),
        help=f"kubelet's device plugin directory (default {DEFAULT_SOCKET_DIR})",
    )
    p.add_argument(
        "--kubeconfig",
        default=env("KUBECONFIG"),
        help="kubeconfig file (env KUBECONFIG); default: in-cluster service account",
    )
    p.add_argument(
        "--no-kube",
        action="store_true",
        help="run without an API server (advertise devices only; Allocate refuses)",
    )
    p.add_argument("--backend", choices=BACKENDS, default=env("DP_BACKEND", "nvidia"), help="card source")
    p.add_argument("--fake-config", default=env("FAKE_CARDS"), help="CARDS.yaml for --backend fake")
    p.add_argument(
        "--scheduler-name",
        default=env("SCHEDULER_NAME"),
        help="only pods of this scheduler are served; default scheduler.schedulerName (hami-scheduler)",
    )
    p.add_argument(
        "--hook-path",
        default=env("HOOK_PATH", "/usr/local"),
        help="HAMi's HOOK_PATH: libvgpu.so and ld.so.preload live in <hook-path>/vgpu (default /usr/local)",
    )
    p.add_argument(
        "--lock-dir",
        default=env("VGPU_LOCK_DIR", "/tmp/vgpulock"),
        help="host directory mounted at /tmp/vgpulock in containers",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        # A string default: argparse applies type=int to it, so a bad METRICS_PORT is a usage error.
        default=env("METRICS_PORT", "9396"),
        help="port of /metrics and /healthz (default 9396; -1 disables)",
    )
    p.add_argument("--metrics-host", default=env("METRICS_HOST", "0.0.0.0"))
    p.add_argument(
        "--register-interval",
        type=float,
        default=30.0,
        help="seconds between node registration annotation checks (default 30)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p  # fmt: skip


async def run(args: argparse.Namespace, *, stop: asyncio.Event | None = None) -> int:
    """Start the plugin from parsed `args` and run until `stop` is set (or SIGTERM/SIGINT). Exit status."""
    from device_plugin.app import DevicePluginApp, PluginOptions
    from hami.config import load_config_file

    config = load_config_file(args.device_config)
    options = PluginOptions(
        node_name=args.node_name,
        config=config,
        resource_name=args.resource_name,
        scheduler_name=args.scheduler_name,
        socket_dir=args.socket_dir,
        hook_path=args.hook_path,
        lock_dir=args.lock_dir,
        metrics_port=None if args.metrics_port < 0 else args.metrics_port,
        metrics_host=args.metrics_host,
        register_interval_s=args.register_interval,
    )
    kube = None
    if not args.no_kube:
        from hami.kube import KubeClient

        kube = KubeClient.from_kubeconfig(args.kubeconfig)
    nvidia = config.nvidia_for_node(args.node_name)
    backend = make_backend(
        args.backend, fake_config=args.fake_config, preconfigured_memory_mib=nvidia.preConfiguredDeviceMemory
    )
    app = DevicePluginApp(options, backend, kube)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await app.start()
    try:
        await stop.wait()
    finally:
        await app.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Console script entry point (``hami-device-plugin = device_plugin.cli:main``).

    Exit status: 0 on SIGTERM/SIGINT, 1 for configuration errors and OS errors at start (one line on
    stderr), 2 for usage errors (missing node name, bad flag or environment value).
    """
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.node_name:
        print("hami-device-plugin: --node-name (or env NODE_NAME) is required", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run(args))
    except HamiError as e:
        print(f"hami-device-plugin: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        # A busy metrics port, an unusable socket directory: one line for the operator, no traceback.
        print(f"hami-device-plugin: cannot start: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
