"""The ``hami-device-plugin`` command: flags and environment -> `DevicePluginApp`, run until SIGTERM/SIGINT.

Precedence, the rule of every server (`hami.settings`): flag > ``HAMI_DEVICE_PLUGIN_<FLAG_NAME>`` >
HAMi's variable name (`ENV_ALIASES`: ``NODE_NAME``, ``CONFIG_FILE``, ...) > device config file
(resource and scheduler name) > built-in default.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from device_plugin import backends
from device_plugin.api import DEFAULT_SOCKET_DIR
from hami import serving, settings
from hami.config import DeviceConfig
from hami.errors import HamiError

__all__ = ["ENV_ALIASES", "ENV_PREFIX", "CommandOptions", "build_parser", "main", "parse_options", "run"]

ENV_PREFIX = "HAMI_DEVICE_PLUGIN_"
#: Flag dest -> HAMi's (and Kubernetes tooling's) variable names, read after ``HAMI_DEVICE_PLUGIN_<DEST>``.
ENV_ALIASES: Mapping[str, tuple[str, ...]] = {
    "node_name": ("NODE_NAME",),
    "device_config": ("CONFIG_FILE",),
    "resource_name": ("RESOURCE_NAME",),
    "socket_dir": ("DEVICE_PLUGIN_DIR",),
    "kubeconfig": ("KUBECONFIG",),
    "backend": ("DP_BACKEND",),
    "fake_config": ("FAKE_CARDS",),
    "scheduler_name": ("SCHEDULER_NAME",),
    "hook_path": ("HOOK_PATH",),
    "lock_dir": ("VGPU_LOCK_DIR",),
    "metrics_port": ("METRICS_PORT",),
    "metrics_host": ("METRICS_HOST",),
}


@dataclass(frozen=True)
class CommandOptions:
    """Every ``hami-device-plugin`` option, resolved (`parse_options`); names are the flags'."""

    node_name: str | None = None
    """``--node-name`` (``NODE_NAME``): this node; required."""
    device_config: str | None = None
    """``--device-config`` (``CONFIG_FILE``): device-config.yaml path; None = built-in defaults."""
    resource_name: str = "nvidia.com/gpu"
    """``--resource-name`` (``RESOURCE_NAME``); default the config's ``nvidia.resourceCountName``."""
    socket_dir: str = DEFAULT_SOCKET_DIR
    """``--socket-dir`` (``DEVICE_PLUGIN_DIR``): kubelet's device plugin directory."""
    kubeconfig: str | None = None
    """``--kubeconfig`` (``KUBECONFIG``); None = in-cluster service account."""
    no_kube: bool = False
    """``--no-kube``: run without an API server (advertise only; Allocate refuses)."""
    backend: str = "nvidia"
    """``--backend`` (``DP_BACKEND``): card source, a name of `device_plugin.backends.BACKENDS`."""
    fake_config: str | None = None
    """``--fake-config`` (``FAKE_CARDS``): CARDS.yaml of ``--backend fake``."""
    scheduler_name: str = "hami-scheduler"
    """``--scheduler-name`` (``SCHEDULER_NAME``); default the config's ``scheduler.schedulerName``."""
    hook_path: str = "/usr/local"
    """``--hook-path`` (``HOOK_PATH``): libvgpu.so and ld.so.preload live in ``<hook-path>/vgpu``."""
    lock_dir: str = "/tmp/vgpulock"
    """``--lock-dir`` (``VGPU_LOCK_DIR``): accepted because HAMi's DaemonSets pass it, and unused: no
    lock directory is mounted into containers (libvgpu reads none)."""
    metrics_port: int = 9396
    """``--metrics-port`` (``METRICS_PORT``): /metrics and /healthz port; -1 = no metrics server."""
    metrics_host: str = "0.0.0.0"
    """``--metrics-host`` (``METRICS_HOST``): metrics listen address."""
    register_interval_s: float = 30.0
    """``--register-interval``, seconds between node registration annotation checks (default 30 s)."""
    verbose: bool = False
    """``-v/--verbose``: debug logging."""
    config: DeviceConfig = field(default_factory=DeviceConfig, compare=False, repr=False)
    """The parsed `device_config` file."""


def build_parser() -> argparse.ArgumentParser:
    """Every flag with its built-in default; environment and config are layered by `parse_options`
    (see docs/device-plugin.md)."""
    p = argparse.ArgumentParser(
        prog="hami-device-plugin",
        description="HAMi legacy-mode NVIDIA device plugin (kubelet device plugin API v1beta1).",
    )
    p.add_argument("--node-name", help="this node's name (env NODE_NAME; required)")
    p.add_argument(
        "--device-config",
        help="device-config.yaml shared with the scheduler (env CONFIG_FILE); default: built-in defaults",
    )
    p.add_argument(
        "--resource-name",
        help="resource to advertise; default nvidia.resourceCountName of the device config (nvidia.com/gpu)",
    )
    p.add_argument(
        "--socket-dir",
        default=DEFAULT_SOCKET_DIR,
        help=f"kubelet's device plugin directory (default {DEFAULT_SOCKET_DIR})",
    )
    p.add_argument(
        "--kubeconfig", help="kubeconfig file (env KUBECONFIG); default: in-cluster service account"
    )
    p.add_argument(
        "--no-kube",
        action="store_true",
        help="run without an API server (advertise devices only; Allocate refuses)",
    )
    p.add_argument("--backend", choices=backends.BACKENDS, default="nvidia", help="card source")
    p.add_argument("--fake-config", help="CARDS.yaml for --backend fake")
    p.add_argument(
        "--scheduler-name",
        help="only pods of this scheduler are served; default scheduler.schedulerName (hami-scheduler)",
    )
    p.add_argument(
        "--hook-path",
        default="/usr/local",
        help="HAMi's HOOK_PATH: libvgpu.so and ld.so.preload live in <hook-path>/vgpu (default /usr/local)",
    )
    p.add_argument(
        "--lock-dir", default="/tmp/vgpulock",
        help="accepted for HAMi compatibility and unused: no lock directory is mounted into containers",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=9396,
        help="port of /metrics and /healthz (default 9396; -1 disables)",
    )
    p.add_argument("--metrics-host", default="0.0.0.0")
    p.add_argument(
        "--register-interval",
        type=settings.argtype(settings.duration),
        default=30.0,
        help="seconds between node registration annotation checks (default 30; 30s, 1m also accepted)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p  # fmt: skip


def _supplied(config: DeviceConfig, values: Mapping[str, Any]) -> dict[str, Any]:
    # The config file supplies the resource name (per node) and the scheduler name.
    nvidia = config.nvidia_for_node(values["node_name"] or "")
    return {"resource_name": nvidia.resourceCountName, "scheduler_name": config.scheduler.schedulerName}


def parse_options(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> CommandOptions:
    """Flag > ``HAMI_DEVICE_PLUGIN_*`` > HAMi's variable names > device config > default (`hami.settings`).

    Exits 2 with the usage message for a bad flag or environment value; raises ConfigError for a bad
    device config file.
    """
    parser = build_parser()
    values, config = serving.resolve_with_device_config(
        parser,
        argv,
        env=env,
        prefix=ENV_PREFIX,
        aliases=ENV_ALIASES,
        flag="--device-config",
        supplies=_supplied,
    )
    _check_paths(parser, values)
    values["register_interval_s"] = values.pop("register_interval")
    return CommandOptions(config=config, **values)


#: AF_UNIX keeps a socket path in a 108-byte ``sun_path`` with its terminating NUL (Linux unix(7)).
_MAX_SOCKET_PATH = 107


def _check_paths(parser: argparse.ArgumentParser, values: dict[str, Any]) -> None:
    """Make ``--socket-dir`` absolute, refuse paths that cannot work; exits 2 naming the flag.

    gRPC reads ``unix://device-plugins/x.sock`` as host ``device-plugins``, so a relative socket
    directory is made absolute here. ``--hook-path`` is a host path the plugin hands kubelet in
    mounts, which must be absolute; guessing from this container's working directory would mount
    the wrong place, so a relative one is refused (``--lock-dir`` is unused, so not checked).
    """
    from device_plugin.kubelet import socket_name  # noqa: PLC0415 - keeps `--help` free of grpc

    values["socket_dir"] = os.path.abspath(values["socket_dir"])
    sock = os.path.join(values["socket_dir"], socket_name(values["resource_name"]))
    if os.path.exists(values["socket_dir"]) and not os.path.isdir(values["socket_dir"]):
        parser.error(f"--socket-dir {values['socket_dir']!r}: not a directory")
    if len(os.fsencode(sock)) > _MAX_SOCKET_PATH:
        parser.error(
            f"--socket-dir {values['socket_dir']!r}: too long for a unix socket path "
            f"({len(os.fsencode(sock))} bytes with the socket name, at most {_MAX_SOCKET_PATH})"
        )
    for dest in ("hook_path",):
        if not os.path.isabs(values[dest]):
            flag = "--" + dest.replace("_", "-")
            parser.error(f"{flag} {values[dest]!r}: must be an absolute host path (kubelet mounts it)")


async def run(options: CommandOptions, *, stop: asyncio.Event | None = None) -> int:
    """Start the plugin for `options` and run until `stop` is set (or SIGTERM/SIGINT). Exit status."""
    from device_plugin.app import DevicePluginApp, PluginOptions

    o = options
    plugin_options = PluginOptions(
        node_name=o.node_name or "",
        config=o.config,
        resource_name=o.resource_name,
        scheduler_name=o.scheduler_name,
        socket_dir=o.socket_dir,
        hook_path=o.hook_path,
        metrics_port=None if o.metrics_port < 0 else o.metrics_port,
        metrics_host=o.metrics_host,
        register_interval_s=o.register_interval_s,
    )
    kube = None
    if not o.no_kube:
        from hami.kube import KubeClient

        kube = KubeClient.from_kubeconfig(o.kubeconfig)
    nvidia = o.config.nvidia_for_node(plugin_options.node_name)
    backend = backends.make_backend(
        o.backend,
        fake_config=o.fake_config,
        preconfigured_memory_mib=nvidia.preConfiguredDeviceMemory,
        operating_mode=nvidia.operatingMode,
        mig_strategy=nvidia.migStrategy,
        mig_allowlist=nvidia.migProfileAllowlist,
    )
    app = DevicePluginApp(plugin_options, backend, kube)

    async def start() -> DevicePluginApp:
        await app.start()
        return app

    await serving.serve_until_signalled(start, stop=stop)
    return 0


def _say(problem: str) -> None:
    print(f"hami-device-plugin: {problem}", file=sys.stderr)


def _node_name_given(options: CommandOptions) -> list[str]:
    return [] if options.node_name else ["--node-name (or env NODE_NAME) is required"]


def _describe(error: BaseException) -> str:
    # A busy metrics port, an unusable socket directory: one line for the operator, no traceback.
    return str(error) if isinstance(error, HamiError) else f"cannot start: {error}"


#: Console script entry point (``hami-device-plugin = device_plugin.cli:main``).
#:
#: Exit status: 0 on SIGTERM/SIGINT, 1 for configuration errors and OS errors at start (one line on
#: stderr), 2 for usage errors (missing node name, bad flag or environment value, a path flag naming
#: a missing file or an unusable directory).
main = serving.ServerMain(
    parse=parse_options,
    serve=run,
    log_level=lambda o: logging.DEBUG if o.verbose else logging.INFO,
    say=_say,
    files=lambda o: {"--fake-config": o.fake_config},
    check=_node_name_given,
    describe=_describe,
    config_status=1,
    start_status=1,
    log_format="%(asctime)s %(levelname)s %(name)s: %(message)s",
)


if __name__ == "__main__":
    sys.exit(main())
