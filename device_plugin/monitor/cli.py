"""`hami-vgpu-monitor`: flags -> `MonitorOptions` -> `main`; no reading logic here.

    hami-vgpu-monitor --node-name node1 --containers-dir /usr/local/vgpu/containers --port 9394
    hami-vgpu-monitor --backend fake --fake-config cards.yaml --kubeconfig ~/.kube/config --legacy-metrics

Precedence, the rule of every server (`hami.settings`): command-line flag > environment variable
``HAMI_MONITOR_<FLAG_NAME>`` (``HAMI_MONITOR_SCAN_INTERVAL=10s``) > built-in default. Aliases read
after the ``HAMI_MONITOR_`` name, HAMi's monitor variables: ``NODE_NAME``, ``KUBECONFIG``,
``HAMI_RESYNC_INTERVAL`` (the grace period); without ``--containers-dir`` HAMi's ``HOOK_PATH`` gives
``$HOOK_PATH/containers``. HAMi's ``--metrics-bind-address [HOST]:PORT`` is accepted too and wins
over ``--address``/``--port``. Durations accept seconds (``300``) or Go-style units (``5m``, ``30s``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from device_plugin.monitor.host import HOST_BACKENDS, make_host
from device_plugin.monitor.options import DEFAULT_CONTAINERS_DIR, DEFAULT_PORT, MonitorOptions
from hami import serving, settings

__all__ = ["ENV_ALIASES", "ENV_PREFIX", "build_parser", "main", "parse_args"]

log = logging.getLogger("device_plugin.monitor")

ENV_PREFIX = "HAMI_MONITOR_"
#: Flag dest -> variables read after ``HAMI_MONITOR_<DEST>`` (HAMi's monitor names).
ENV_ALIASES: Mapping[str, tuple[str, ...]] = {
    "node_name": ("NODE_NAME",),
    "kubeconfig": ("KUBECONFIG",),
    "grace_period": ("HAMI_RESYNC_INTERVAL",),
}

duration = settings.argtype(settings.duration)


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port; valid: 0..65535") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port; valid: 0..65535")
    return port


def build_parser() -> argparse.ArgumentParser:
    """Every flag, with its built-in default; `parse_args` layers the environment over it."""
    p = argparse.ArgumentParser(
        prog="hami-vgpu-monitor",
        description="HAMi vGPU node monitor: per-container GPU memory and utilisation from the shared "
        "region files, as Prometheus metrics with HAMi's names",
    )
    p.add_argument("--node-name", default="", help="this node's name (env NODE_NAME; required)")
    p.add_argument("--containers-dir", default="",
                   help=f"host directory of the per-container cache dirs <podUID>_<container> "
                   f"(default $HOOK_PATH/containers, else {DEFAULT_CONTAINERS_DIR})")  # fmt: skip
    p.add_argument("--kubeconfig", default="", help="kubeconfig file (env KUBECONFIG); default: in-cluster")
    p.add_argument("--address", default="0.0.0.0", help="listen address of /metrics (default 0.0.0.0)")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"listen port (default {DEFAULT_PORT})")
    p.add_argument("--metrics-bind-address", default="",
                   help="HAMi's form [HOST]:PORT (e.g. :9394); wins over --address/--port")  # fmt: skip
    p.add_argument("--backend", choices=HOST_BACKENDS, default="nvidia",
                   help="source of the hami_host_gpu_* figures: nvidia (NVML) or fake (--fake-config)")  # fmt: skip
    p.add_argument("--fake-config", default="", help="cards YAML of --backend fake (no file: no cards)")
    p.add_argument("--scan-interval", type=duration, default=5.0, help="seconds between scans (default 5s)")
    p.add_argument("--grace-period", type=duration, default=300.0,
                   help="a directory whose pod is gone this long is removed (env HAMI_RESYNC_INTERVAL, "
                   "default 5m)")  # fmt: skip
    p.add_argument("--legacy-metrics", action="store_true", help="also export HAMi's old metric names")
    p.add_argument("--proc", default="/proc", help="the host's /proc (default /proc; run with hostPID)")
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    return p


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> MonitorOptions:
    """Flags > ``HAMI_MONITOR_*`` environment > defaults (see the module docstring).

    Exits 2 with the usage message for a bad flag or environment value or a missing node name.
    """
    env = os.environ if env is None else env
    parser = build_parser()
    v = settings.resolve(parser, argv, env=env, prefix=ENV_PREFIX, aliases=ENV_ALIASES)
    if not v["node_name"]:
        parser.error("--node-name (or env NODE_NAME) is required")
    for dest in ("scan_interval", "grace_period"):
        if v[dest] < 0 or (dest == "scan_interval" and v[dest] == 0):
            parser.error(
                f"--{dest.replace('_', '-')} {v[dest]:g}s: must be {'> 0' if dest == 'scan_interval' else '>= 0'}"
            )
    # Without a readable proc file system every slot would look dead and every container would show
    # 0 bytes used: refuse it instead of exporting wrong figures. Pid 1 exists in every pid namespace.
    if not os.path.isfile(os.path.join(v["proc"], "1", "stat")):
        parser.error(f"--proc {v['proc']!r}: not a proc file system (no {v['proc'].rstrip('/')}/1/stat)")
    containers_dir = v["containers_dir"]
    if not containers_dir:
        hook = env.get("HOOK_PATH")
        containers_dir = f"{hook.rstrip('/')}/containers" if hook else DEFAULT_CONTAINERS_DIR
    address, port = v["address"], v["port"]
    if v["metrics_bind_address"]:
        host, sep, port_text = v["metrics_bind_address"].rpartition(":")
        try:
            port = _port(port_text) if sep else _port("")
        except argparse.ArgumentTypeError:
            parser.error(
                f"--metrics-bind-address {v['metrics_bind_address']!r}: want [HOST]:PORT, e.g. :9394"
            )
        address = host.strip("[]") or "0.0.0.0"
    return MonitorOptions(
        node_name=v["node_name"],
        containers_dir=containers_dir,
        kubeconfig=v["kubeconfig"] or None,
        address=address,
        port=port,
        backend=v["backend"],
        fake_config=v["fake_config"] or None,
        scan_interval_s=v["scan_interval"],
        grace_period_s=v["grace_period"],
        legacy_metrics=v["legacy_metrics"],
        proc=v["proc"],
        log_level=v["log_level"],
    )


async def serve(options: MonitorOptions) -> None:
    """Run until SIGTERM/SIGINT."""
    from device_plugin.monitor.app import MonitorApp  # noqa: PLC0415 - keeps `--help` free of the kube client
    from hami.kube import KubeClient  # noqa: PLC0415

    host = make_host(options.backend, fake_config=options.fake_config)
    kube = KubeClient.from_kubeconfig(options.kubeconfig)
    app = MonitorApp(options, host, kube)

    async def start() -> MonitorApp:
        await app.start()
        return app

    try:
        await serving.serve_until_signalled(start)
    finally:
        kube.close()


#: Console entry point (``hami-vgpu-monitor = device_plugin.monitor.cli:main``).
#: Exit status: 0 on SIGTERM/SIGINT; 2 for bad flags or environment values (usage message), a bad
#: kubeconfig, an unusable host backend or a busy port (one line on stderr).
main = serving.ServerMain(
    parse=parse_args, serve=serve, log_level=lambda o: o.log_level, say=serving.logged(log)
)


if __name__ == "__main__":
    sys.exit(main())
