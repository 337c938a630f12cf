"""The `inspect` and `explain` subcommands: flags, the one read of the API server, exit statuses.

Flags follow kubectl's (``--kubeconfig``, ``--context``, ``-n/--namespace``, ``-o``), so the same words work
as ``hami inspect`` and as the kubectl plugin ``kubectl hami inspect``. The kubeconfig is `--kubeconfig`,
else the first file of ``$KUBECONFIG``, else ``~/.kube/config``, else the pod's service account.

Every failure is one line on stderr, and the exit status says which (`EXIT_*`): a person sees the cause,
a script can branch on it. No traceback (``HAMI_DEBUG=1`` shows it for an internal error).
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from typing import Any

import yaml

from hami.errors import ApiError, HamiError, InvalidRequest, NotFound

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2  # a flag, the kubeconfig, a bad --now
EXIT_UNREACHABLE = 3  # the API server (or --prometheus) could not be reached
EXIT_FORBIDDEN = 4  # 401/403: the credentials may not list nodes, pods or resourcequotas
EXIT_NOT_FOUND = 5  # the pod or a named node does not exist


def _duration(value: str) -> float:
    from hami.settings import duration

    try:
        seconds = duration(value)
    except InvalidRequest as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{value!r}: want a duration > 0, e.g. 5m")
    return seconds


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _add_common(p: argparse.ArgumentParser, *, namespace: bool) -> None:
    from hami.tools.render import FORMATS

    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)",
    )
    p.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current context)")
    if namespace:
        p.add_argument("-n", "--namespace", metavar="NS",
                       help="namespace of a POD given without one (default: the context's, else default)")  # fmt: skip
    p.add_argument("-o", "--output", choices=FORMATS, default="table", help="output format (default: table)")
    p.add_argument("--request-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="per API request (default: 10)")  # fmt: skip
    p.add_argument("--scheduler-name", default="hami-scheduler", metavar="NAME",
                   help="pods of this scheduler are counted, as the extender counts them (default: hami-scheduler)")  # fmt: skip
    p.add_argument("--device-config", metavar="FILE",
                   help="the scheduler's device-config.yaml (resource names, split counts, policies; default: "
                   "read from the cluster, see --device-configmap)")  # fmt: skip
    p.add_argument("--device-configmap", metavar="NAMESPACE/NAME",
                   help="the ConfigMap the scheduler reads its device-config.yaml from (default: the chart's, "
                   "hami-system/hami-scheduler-device, else the one labelled "
                   "app.kubernetes.io/component=device-config, else HAMi's defaults with a warning)")  # fmt: skip
    p.add_argument("--node-lock-timeout", type=_duration, default="5m", metavar="DURATION",
                   help="the extender's --node-lock-timeout (chart: scheduler.extender.nodeLockTimeout): an older "
                   "node lock is shown as expired (default 5m)")  # fmt: skip
    p.add_argument("--now", metavar="RFC3339",
                   help="judge lock ages and handshakes at this time instead of the current one (reproducible reports)")  # fmt: skip


def add_commands(sub: Any) -> None:
    """Register `inspect` and `explain` on the `hami` subparsers object."""
    ins = sub.add_parser(
        "inspect",
        help="what is on each GPU node and card: allocation, health, locks, fragmentation",
        description="List nodes and pods once (read-only) and show, per node, the cards, slots, memory and "
        "cores allocated, health, cordon and lock state; per card (-o wide, or nodes named) the containers "
        "on it; a footer per card model and the namespace quotas.",
    )
    ins.add_argument("nodes", nargs="*", metavar="NODE", help="only these nodes (their cards are listed)")
    _add_common(ins, namespace=False)
    ins.add_argument("--usage", action="store_true",
                     help="join the node monitors' used memory and utilisation; flag allocated-but-idle containers")  # fmt: skip
    ins.add_argument("--monitor-url", metavar="TEMPLATE",
                     help="monitor URL per node, {node} and {ip} filled in (default: http://{ip}:9394/metrics)")  # fmt: skip
    ins.add_argument(
        "--prometheus", metavar="URL", help="read the monitors' figures from this Prometheus instead"
    )
    ins.set_defaults(run=run_inspect)
    exp = sub.add_parser(
        "explain",
        help="why a pod is Pending (or where it went), from the scheduler's real filter",
        description="Run the scheduler extender's filter for the pod against a read-only snapshot (nothing "
        "is reserved or written) and print why each node fails, grouped and counted, and what would change "
        "the answer; for a scheduled pod its cards and the other nodes' scores.",
    )
    exp.add_argument("pod", metavar="[NAMESPACE/]POD")
    _add_common(exp, namespace=True)
    exp.set_defaults(run=run_explain)


def kubeconfig_path(flag: str | None, env: dict[str, str] | None = None) -> str | None:
    """`flag`, else the first existing file of ``$KUBECONFIG``, else ``~/.kube/config`` if present, else None."""
    env = dict(os.environ) if env is None else env
    if flag:
        return flag
    for p in (env.get("KUBECONFIG") or "").split(os.pathsep):
        if p and os.path.exists(p):
            return p
    home = os.path.join(os.path.expanduser("~"), ".kube", "config")
    return home if os.path.exists(home) else None


def context_namespace(path: str | None, context: str | None) -> str:
    """The namespace of the kubeconfig context (kubectl's default for a bare pod name), else ``default``."""
    if path is None:
        return "default"
    try:
        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f) or {}
        name = context or cfg.get("current-context")
        for c in cfg.get("contexts") or []:
            if c.get("name") == name:
                return (c.get("context") or {}).get("namespace") or "default"
    except (OSError, yaml.YAMLError, AttributeError):
        pass
    return "default"


def _now(value: str | None) -> datetime:
    if not value:
        return datetime.now(UTC)
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(f"--now {value!r}: want an RFC 3339 time such as 2026-05-04T10:00:00Z") from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _snapshot(args: argparse.Namespace) -> Any:
    from hami.config import load_config_file
    from hami.kube import KubeClient
    from hami.tools import deviceconfig
    from hami.tools.snapshot import Snapshot, read_objects

    now = _now(args.now)
    # Local input first: a bad file is reported before any connection is tried.
    config = load_config_file(args.device_config) if args.device_config else None
    path = kubeconfig_path(args.kubeconfig)
    if args.request_timeout <= 0:
        raise InvalidRequest(f"--request-timeout {args.request_timeout:g}: want seconds > 0")
    if args.device_config and args.device_configmap:
        raise InvalidRequest("--device-config and --device-configmap: give one")
    if args.device_configmap:
        deviceconfig.parse_ref(args.device_configmap)
    client = KubeClient.from_kubeconfig(path, context=args.context, timeout_s=args.request_timeout,
                                        retries=1, retry_initial_wait_s=0.1, retry_max_wait_s=0.5)  # fmt: skip
    try:
        if config is None:
            found = deviceconfig.read(client, args.device_configmap)
            if found.warning:
                print(f"hami: warning: {found.warning}", file=sys.stderr)
            config = found.config
        listed = read_objects(client)
    finally:
        client.close()
    return Snapshot.build(listed, config=config, now=now, scheduler_name=args.scheduler_name,
                          lock_timeout_s=args.node_lock_timeout)  # fmt: skip


def _style(stream: Any) -> Any:
    from hami.tools.table import Style, use_color

    return Style(use_color(stream))


def run_inspect(args: argparse.Namespace) -> int:
    from hami.tools import usage
    from hami.tools.inspect import inspect_cluster
    from hami.tools.render import render_inspect

    def go() -> int:
        snap = _snapshot(args)
        report = inspect_cluster(snap, args.nodes)
        if args.usage or args.prometheus or args.monitor_url:
            if args.prometheus:
                try:
                    figures = usage.query_prometheus(args.prometheus, timeout_s=args.request_timeout)
                except (OSError, ValueError) as e:
                    raise ApiError(f"prometheus {args.prometheus}: {e}", reason="Transport") from None
            else:
                names = {n.name for n in report.nodes if n.cards}
                nodes = [n for n in snap.listed.nodes if n["metadata"]["name"] in names]
                figures, warnings = usage.scrape_monitors(nodes, args.monitor_url or usage.DEFAULT_MONITOR_URL,
                                                          timeout_s=args.request_timeout)  # fmt: skip
                for w in warnings:
                    print(f"hami: warning: {w}", file=sys.stderr)
            usage.join(report, figures)
        sys.stdout.write(
            render_inspect(report, args.output, style=_style(sys.stdout), cards=bool(args.nodes))
        )
        return EXIT_OK

    return guarded(go)


def run_explain(args: argparse.Namespace) -> int:
    from hami.tools.explain import explain_pod
    from hami.tools.render import render_explain
    from hami.tools.snapshot import split_ref

    def go() -> int:
        default_ns = args.namespace or context_namespace(kubeconfig_path(args.kubeconfig), args.context)
        ns, name = split_ref(args.pod, default_ns)
        if not ns or not name:
            raise InvalidRequest(f"pod {args.pod!r}: want NAMESPACE/POD or POD")
        snap = _snapshot(args)
        ex = explain_pod(snap, ns, name)
        sys.stdout.write(render_explain(ex, args.output, style=_style(sys.stdout)))
        return EXIT_OK

    return guarded(go)


def exit_status(e: BaseException) -> int:
    """The exit status for an error of the tools (see the module docstring)."""
    if isinstance(e, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(e, ApiError):
        if e.status in (401, 403):
            return EXIT_FORBIDDEN
        if e.status is None or e.reason == "Transport":
            return EXIT_UNREACHABLE
        return EXIT_INTERNAL
    if isinstance(e, InvalidRequest):
        return EXIT_USAGE
    return EXIT_INTERNAL


def guarded(fn: Any) -> int:
    """Run `fn`, turning the tools' errors into one stderr line and their exit status."""
    try:
        return fn()
    except (HamiError, OSError) as e:
        code = exit_status(e)
        hint = ""
        if code == EXIT_FORBIDDEN:
            hint = " (the tools need get/list on nodes, pods and resourcequotas, and get on the device ConfigMap)"
        elif code == EXIT_UNREACHABLE:
            hint = " (check --kubeconfig / --context and that the API server is up)"
        if isinstance(e, OSError) and not isinstance(e, HamiError):
            where = f"{e.filename}: " if e.filename else ""
            print(f"hami: error: {where}{_one_line(e.strerror or e)}", file=sys.stderr)
            return EXIT_USAGE
        print(f"hami: error: {_one_line(e)}{hint}", file=sys.stderr)
        return code
