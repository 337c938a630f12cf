"""The rendered parts fit each other and the code: every container's flags parse with the real argument
parser of its command, the extender URL and every Service reach the port the container really listens
on, probes and webhook paths are routes the servers register, mounted files exist where the flags
point, managedResources covers every vendor's resources, and the rendered device config loads with
hami/config.py and gives the values set."""

from __future__ import annotations

import argparse
import ast
import configparser
import functools
import importlib
import importlib.util
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from hami.config import load_config
from hami.vendors import build_vendors
from scheduler_extender.options import split_host_port
from tests.chart.conftest import rendered
from tests.chart.render import NAMESPACE, ROOT, Rendered, render

POD_KINDS = ("Deployment", "DaemonSet", "Job")
NODE = "gpu-node-1"

# Commands that are not ours: what the chart may pass them, checked by hand.
FOREIGN = {
    "kube-scheduler": {"--config", "-v"},
    "/usr/local/bin/vgpu-init.sh": set(),
}


def console_scripts() -> dict[str, str]:
    """setup.cfg's console scripts: name -> module path ("hami-webhook" -> "webhook.cli")."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    out = {}
    for line in cfg["options.entry_points"]["console_scripts"].strip().splitlines():
        name, target = (s.strip() for s in line.split("=", 1))
        out[name] = target.split(":")[0]
    return out


def load_certgen():
    spec = importlib.util.spec_from_file_location("hami_certgen", ROOT / "images" / "hami" / "certgen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parser_for(command: str) -> argparse.ArgumentParser:
    """The real parser behind `command`: `build_parser()` of its console script's module."""
    if command == "hami-certgen":  # installed from images/hami/certgen.py by the Dockerfile
        return load_certgen().build_parser()
    scripts = console_scripts()
    assert command in scripts, f"{command}: not a console script in setup.cfg ({sorted(scripts)})"
    # A console script whose module is gone fails here (a deletion must not pass as a skip).
    module = importlib.import_module(scripts[command])
    build = getattr(module, "build_parser", None)
    assert build is not None, f"{scripts[command]} has no build_parser()"
    return build()


def containers(r: Rendered):
    """(object, pod spec, container) for every container and init container of every pod."""
    for o in r.objects:
        if o["kind"] in POD_KINDS:
            spec = o["spec"]["template"]["spec"]
            for c in spec.get("initContainers", []) + spec["containers"]:
                yield o, spec, c


def expand(arg: str, container: dict) -> str:
    """Kubernetes' $(VAR) expansion in args, with the downward API's node name."""
    for e in container.get("env", []):
        value = e.get("value", NODE if "valueFrom" in e else "")
        arg = arg.replace(f"$({e['name']})", value)
    return arg


def parsed(container: dict) -> argparse.Namespace:
    args = [expand(a, container) for a in container.get("args", [])]
    parser = parser_for(container["command"][0])
    try:
        return parser.parse_args(args)
    except SystemExit:
        pytest.fail(f"{container['name']}: {container['command'][0]} rejects {args}")


def container(r: Rendered, kind: str, name: str, container_name: str) -> tuple[dict, dict]:
    spec = r.one(kind, name)["spec"]["template"]["spec"]
    [c] = [c for c in spec["containers"] if c["name"] == container_name]
    return spec, c


def named_port(c: dict, name: str) -> int:
    [p] = [p["containerPort"] for p in c.get("ports", []) if p["name"] == name]
    return p


@functools.cache
def routes(package: str) -> dict[str, set[str]]:
    """Paths each server package registers, by method: {"GET": {"/healthz", ...}, "POST": {...}}."""
    out: dict[str, set[str]] = {"GET": set(), "POST": set()}
    for path in (ROOT / package).glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("add_get", "add_post")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                out["GET" if node.func.attr == "add_get" else "POST"].add(node.args[0].value)
    return out


def file_source(r: Rendered, spec: dict, c: dict, path: str) -> tuple[dict, str]:
    """The rendered ConfigMap or the Secret name behind file `path` in container `c`: (volume, key)."""
    for m in c.get("volumeMounts", []):
        mount = m["mountPath"].rstrip("/")
        if path.startswith(mount + "/"):
            [vol] = [v for v in spec["volumes"] if v["name"] == m["name"]]
            return vol, path[len(mount) + 1 :]
    pytest.fail(f"{c['name']}: nothing is mounted for {path}")


# -- flags ------------------------------------------------------------------------------------


def test_every_container_flag_is_accepted_by_its_parser(value_set: str) -> None:
    seen = set()
    for _o, _spec, c in containers(rendered(value_set)):
        command = c["command"][0]
        if command in FOREIGN:
            flags = {a.split("=")[0] for a in c.get("args", []) if a.startswith("-")}
            assert flags <= FOREIGN[command], (c["name"], flags)
        else:
            parsed(c)
        seen.add(command)
    assert {"kube-scheduler", "hami-scheduler-extender", "hami-device-plugin"} <= seen
    if value_set != "cert-manager":
        assert "hami-certgen" in seen


def test_monitor_args_parse_with_its_parser() -> None:
    _spec, mon = container(rendered("defaults"), "DaemonSet", "hami-device-plugin", "hami-vgpu-monitor")
    args = parsed(mon)  # skips with the reason while device_plugin.monitor is not in the tree
    assert args.node_name == NODE
    assert args.containers_dir == "/usr/local/vgpu/containers"
    assert args.port == named_port(mon, "monitor") == 9394
    assert args.backend == "nvidia" and args.scan_interval == 5.0


def test_a_wrong_flag_is_caught() -> None:
    _spec, ext = container(rendered("defaults"), "Deployment", "hami-scheduler", "hami-scheduler-extender")
    bad = {**ext, "args": [*ext["args"], "--http_bind=0.0.0.0:443"]}  # HAMi's flag, not ours
    with pytest.raises(pytest.fail.Exception, match="rejects"):
        parsed(bad)


def test_extender_extra_args_reach_the_parser() -> None:
    r = render({"scheduler": {"extender": {"extraArgs": ["--kube-qps=50", "--async-record"]}}})
    _spec, ext = container(r, "Deployment", "hami-scheduler", "hami-scheduler-extender")
    args = parsed(ext)
    assert args.kube_qps == 50.0 and args.async_record is True


# -- ports and paths --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [{}, {"scheduler": {"extender": {"port": 9443}}}, {"scheduler": {"replicas": 3}}],
    ids=["defaults", "extender-port", "replicas-3"],
)
def test_extender_url_reaches_the_extenders_real_port(values: dict) -> None:
    r = render(values)
    cfg = yaml.safe_load(r.one("ConfigMap", "hami-scheduler")["data"]["config.yaml"])
    url = urlsplit(cfg["extenders"][0]["urlPrefix"])
    spec, ext = container(r, "Deployment", "hami-scheduler", "hami-scheduler-extender")
    args = parsed(ext)
    assert url.scheme == "http" and not args.tls_cert_file
    # Same pod; the verbs on loopback only (nothing on the pod IP can place or bind a pod).
    assert url.hostname == "127.0.0.1" and args.address == "127.0.0.1"
    assert url.port == args.port
    server = routes("scheduler_extender")
    extender = cfg["extenders"][0]
    for verb in ("filterVerb", "prioritizeVerb", "bindVerb"):
        assert f"{url.path.rstrip('/')}/{extender[verb]}" in server["POST"], verb
    # kube-scheduler rejects an extender with a prioritizeVerb and no positive weight.
    assert extender["weight"] > 0
    # kube-scheduler reads the ConfigMap key the flag names.
    _spec, ks = container(r, "Deployment", "hami-scheduler", "kube-scheduler")
    path = next(a for a in ks["args"] if a.startswith("--config=")).split("=", 1)[1]
    vol, key = file_source(r, spec, ks, path)
    assert key in r.one("ConfigMap", vol["configMap"]["name"])["data"]


def test_probes_hit_routes_on_the_listening_port(value_set: str) -> None:
    packages = {"hami-scheduler-extender": "scheduler_extender", "hami-webhook": "webhook",
                "hami-device-plugin": "device_plugin", "hami-vgpu-monitor": "device_plugin/monitor"}  # fmt: skip
    probed = 0
    for _o, _spec, c in containers(rendered(value_set)):
        command = c["command"][0]
        for probe in ("readinessProbe", "livenessProbe"):
            get = (c.get(probe) or {}).get("httpGet")
            if not get or command not in packages:
                continue
            assert get["path"] in routes(packages[command])["GET"], (c["name"], get)
            port = named_port(c, get["port"]) if isinstance(get["port"], str) else get["port"]
            args = parsed(c)
            if command == "hami-device-plugin":
                listening = getattr(args, "metrics_port", None)
            elif command == "hami-scheduler-extender":
                # Probes reach the pod IP: the health and metrics listener, not the loopback verbs.
                listening = split_host_port(args.metrics_bind_address)[1]
            else:
                listening = args.port
            assert port == listening, (c["name"], probe, port, listening)
            probed += 1
    assert probed >= 4


def test_webhook_service_and_configuration_reach_the_container() -> None:
    r = rendered("defaults")
    spec, wh = container(r, "Deployment", "hami-webhook", "hami-webhook")
    args = parsed(wh)
    svc = r.one("Service", "hami-webhook")
    [port] = svc["spec"]["ports"]
    assert named_port(wh, port["targetPort"]) == args.port == 8443
    labels = r.one("Deployment", "hami-webhook")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    [hook] = r.one("MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    ref = hook["clientConfig"]["service"]
    assert (ref["name"], ref["namespace"], ref["port"]) == ("hami-webhook", NAMESPACE, port["port"])
    assert ref["path"] in routes("webhook")["POST"]
    # TLS files come from the Secret the certificate job (or cert-manager) writes.
    for flag in (args.tls_cert_file, args.tls_private_key_file):
        vol, key = file_source(r, spec, wh, flag)
        assert vol["secret"]["secretName"] == "hami-webhook-tls" and key in ("tls.crt", "tls.key")
    assert args.in_cluster is True, "quota pre-check on by default"


def test_metrics_services_reach_the_containers() -> None:
    r = rendered("defaults")
    _spec, ext = container(r, "Deployment", "hami-scheduler", "hami-scheduler-extender")
    [p] = r.one("Service", "hami-scheduler")["spec"]["ports"]
    # The Service reaches health and metrics only, never the verbs (which listen on 127.0.0.1).
    assert named_port(ext, p["targetPort"]) == split_host_port(parsed(ext).metrics_bind_address)[1]
    assert named_port(ext, p["targetPort"]) != parsed(ext).port
    _spec, mon = container(r, "DaemonSet", "hami-device-plugin", "hami-vgpu-monitor")
    [p] = r.one("Service", "hami-device-plugin-monitor")["spec"]["ports"]
    assert p["name"] == "monitorport" and named_port(mon, p["targetPort"]) == 9394


def test_device_plugin_paths_match_its_flags() -> None:
    r = rendered("defaults")
    spec, dp = container(r, "DaemonSet", "hami-device-plugin", "hami-device-plugin")
    args = parsed(dp)
    mounts = {m["mountPath"] for m in dp["volumeMounts"]}
    assert args.socket_dir in mounts
    assert f"{args.hook_path}/vgpu" in mounts
    assert not any("vgpulock" in m for m in mounts)  # HAMi's lock directory: libvgpu reads none
    vol, key = file_source(r, spec, dp, args.device_config)
    assert key in r.one("ConfigMap", vol["configMap"]["name"])["data"]
    hosts = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert {args.socket_dir, f"{args.hook_path}/vgpu"} <= hosts and "/tmp/vgpulock" not in hosts
    [init] = spec["initContainers"]
    assert init["args"] == [f"{args.hook_path}/vgpu"]


# -- device config and managed resources ------------------------------------------------------


def device_config(r: Rendered):
    text = r.one("ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"]
    return load_config(yaml.safe_load(text))


def managed(r: Rendered) -> list[str]:
    cfg = yaml.safe_load(r.one("ConfigMap", "hami-scheduler")["data"]["config.yaml"])
    return [m["name"] for m in cfg["extenders"][0]["managedResources"]]


def test_rendered_device_config_loads(value_set: str) -> None:
    cfg = device_config(rendered(value_set))
    assert cfg.nvidia.deviceSplitCount == 10
    assert cfg.scheduler.schedulerName == "hami-scheduler"


def test_device_config_gives_the_values_set() -> None:
    values = {
        "schedulerName": "gpu-sched",
        "resourceMem": "example.com/vmem",
        "scheduler": {"defaultSchedulerPolicy": {"nodeSchedulerPolicy": "spread", "gpuSchedulerPolicy": "binpack,numa"}},
        "devicePlugin": {
            "deviceSplitCount": 4, "deviceMemoryScaling": 1.5, "deviceCoreScaling": 2, "runtimeClassName": "nvidia",
            "nodeconfig": [{"name": "node-a", "devicesplitcount": 2, "devicememoryscaling": 3}],
        },
        "devices": {"nvidia": {"gpuCorePolicy": "force", "defaultMemory": 1024, "defaultCores": 30,
                               "libCudaLogLevel": 3, "overwriteEnv": True}},
    }  # fmt: skip
    r = render(values)
    cfg = device_config(r)
    n = cfg.nvidia
    assert (n.deviceSplitCount, n.deviceMemoryScaling, n.deviceCoreScaling) == (4, 1.5, 2.0)
    assert (n.gpuCorePolicy, n.defaultMemory, n.defaultCores, n.libCudaLogLevel) == ("force", 1024, 30, 3)
    assert n.overwriteEnv is True and n.runtimeClassName == "nvidia"
    assert n.resourceMemoryName == "example.com/vmem"
    assert (cfg.scheduler.nodeSchedulerPolicy, cfg.scheduler.gpuSchedulerPolicy) == ("spread", "binpack,numa")
    assert cfg.scheduler.schedulerName == "gpu-sched"
    node = cfg.nvidia_for_node("node-a")
    assert (node.deviceSplitCount, node.deviceMemoryScaling, node.deviceCoreScaling) == (2, 3.0, 2.0)
    assert cfg.nvidia_for_node("node-b").deviceSplitCount == 4
    assert "example.com/vmem" in managed(r)
    # The same name reaches the webhook and kube-scheduler's profile.
    assert yaml.safe_load(r.one("ConfigMap", "hami-scheduler")["data"]["config.yaml"])["profiles"] == [
        {"schedulerName": "gpu-sched"}
    ]


def test_managed_resources_cover_every_enabled_vendor(value_set: str) -> None:
    r = rendered(value_set)
    names = managed(r)
    vendors = build_vendors(device_config(r))
    assert "NVIDIA" in vendors
    for word, vendor in vendors.items():
        missing = set(vendor.resource_names().all()) - set(names)
        assert not missing, f"{word}: {missing} not in managedResources"
    assert len(names) == len(set(names))


def test_enabling_a_vendor_needs_only_a_values_entry() -> None:
    off = managed(rendered("defaults"))
    on = managed(rendered("second-vendor"))
    added = set(on) - set(off)
    assert "huawei.com/Ascend910B3-memory" in added and all(n.startswith("huawei.com/") for n in added)
    text = rendered("second-vendor").one("ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"]
    assert yaml.safe_load(text)["scheduler"]["enableAscend"] is True
    assert any(w.startswith("Ascend") for w in build_vendors(device_config(rendered("second-vendor"))))
    assert not any(w.startswith("Ascend") for w in build_vendors(device_config(rendered("defaults"))))


def test_a_renamed_vendor_resource_reaches_managed_resources() -> None:
    renamed = {"resourceCountName": "example.com/mlu", "resourceMemoryName": "example.com/mlu-mem",
               "resourceCoreName": "example.com/mlu-core"}  # fmt: skip
    r = render({"devices": {"cambricon": {"deviceConfig": renamed}}})
    text = r.one("ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"]
    assert yaml.safe_load(text)["cambricon"] == renamed
    names = managed(r)
    [mlu] = [v for w, v in build_vendors(device_config(r)).items() if w == "MLU"]
    assert set(mlu.resource_names().all()) == set(renamed.values()) <= set(names)


def test_overlapping_vendor_names_appear_once() -> None:
    # kube-scheduler refuses a duplicate managedResources name.
    dup = managed(
        render({"devices": {"mthreads": {"customresources": ["nvidia.com/gpu", "mthreads.com/vgpu"]}}})
    )
    assert dup.count("nvidia.com/gpu") == 1 and "mthreads.com/vgpu" in dup


# -- the whole command line, as the container starts ------------------------------------------


def full_parse(command: str):
    module = importlib.import_module(console_scripts()[command])
    return getattr(module, "parse_args", None) or module.parse_options


@pytest.mark.parametrize(
    ("kind", "name", "container_name"),
    [("Deployment", "hami-scheduler", "hami-scheduler-extender"), ("Deployment", "hami-webhook", "hami-webhook"),
     ("DaemonSet", "hami-device-plugin", "hami-device-plugin"), ("DaemonSet", "hami-device-plugin", "hami-vgpu-monitor")],
)  # fmt: skip
def test_each_server_starts_from_its_rendered_command_line(
    tmp_path: Path, kind: str, name: str, container_name: str
) -> None:
    """The server's own option parsing (flags > env > device config) accepts the container as rendered,
    with the files its volumes provide: ConfigMaps written from the render, the TLS pair from certgen."""
    r = render({"devicePlugin": {"deviceSplitCount": 7}})
    spec, c = container(r, kind, name, container_name)
    command = c["command"][0]
    assert command in console_scripts() and importlib.util.find_spec(console_scripts()[command]), command
    ca, cert, key = load_certgen().make_certificates(["hami-webhook.hami-system.svc"], validity_days=1)
    secrets = {"hami-webhook-tls": {"tls.crt": cert.decode(), "tls.key": key.decode(), "ca.crt": ca.decode()}}
    moved = {}
    for m in c.get("volumeMounts", []):
        [vol] = [v for v in spec["volumes"] if v["name"] == m["name"]]
        if "configMap" in vol:
            files = r.one("ConfigMap", vol["configMap"]["name"])["data"]
        elif "secret" in vol:
            files = secrets[vol["secret"]["secretName"]]
        else:
            continue
        local = tmp_path / m["name"]
        local.mkdir()
        for fname, text in files.items():
            (local / fname).write_text(text)
        moved[m["mountPath"].rstrip("/")] = str(local)
    argv = []
    for a in c.get("args", []):
        a = expand(a, c)
        for mount, local in moved.items():
            a = a.replace(f"={mount}/", f"={local}/")
        argv.append(a)
    env = {e["name"]: e.get("value", NODE if "valueFrom" in e else "") for e in c.get("env", [])}
    try:
        options = full_parse(command)(argv, env)
    except SystemExit:
        pytest.fail(f"{command} refuses {argv} with env {env}")
    config = getattr(options, "device_config", None) or getattr(options, "config", None)
    if config is not None and not isinstance(config, str):
        assert config.nvidia.deviceSplitCount == 7, "the rendered device config was read"
    if hasattr(options, "scheduler_name"):
        assert options.scheduler_name == "hami-scheduler"
