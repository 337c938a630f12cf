"""HAMi v2.10's own values file (tests/chart/data/hami-v2.10.0-values.yaml) given to this chart.

The fixture is charts/hami/values.yaml of Project-HAMi/HAMi at tag v2.10.0 (Apache-2.0), byte for byte
(a copy of ../shared/reference/hami-v2.10.0/values.yaml; the test below compares them where that
directory is present). HAMi's own flags and images, which would crash-loop a pod here, are refused at
render time with the key named; every other key of the file is either honoured (it is in our
values.yaml) or listed in helm/hami/files/hami-keys.yaml, refused unless at a value that means the same
here; after the edits docs/install.md lists, the file renders, every object validates strictly and every
container's flags parse with our real parsers."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import helm_python
import pytest
import yaml

from hami.config import load_config
from tests.chart.render import ROOT, render
from tests.chart.schemas import validate
from tests.chart.test_chart_fit import FOREIGN, containers, parsed, parser_for
from tests.ci import SHARED, needs_shared

FIXTURE = Path(__file__).parent / "data" / "hami-v2.10.0-values.yaml"
HAMI_VALUES = yaml.safe_load(FIXTURE.read_text())
VALIDATE = (ROOT / "helm" / "hami" / "templates" / "validate.yaml").read_text()
TABLE = yaml.safe_load((ROOT / "helm" / "hami" / "files" / "hami-keys.yaml").read_text())["keys"]
OURS = yaml.safe_load((ROOT / "helm" / "hami" / "values.yaml").read_text())


SOURCE = SHARED / "reference" / "hami-v2.10.0" / "values.yaml"


@needs_shared(SOURCE)
def test_the_fixture_is_hamis_file_unchanged() -> None:
    assert FIXTURE.read_bytes() == SOURCE.read_bytes()


def migrated(values: dict) -> dict:
    """The edits of docs/install.md's "Migrating from HAMi": drop HAMi's images, its image tag and its
    flag lists."""
    v = copy.deepcopy(values)
    v["global"].pop("imageTag")
    v["scheduler"]["kubeScheduler"].pop("image")
    v["scheduler"]["kubeScheduler"].pop("extraArgs")
    v["scheduler"]["extender"].pop("image")
    v["scheduler"]["extender"].pop("extraArgs")
    v["devicePlugin"].pop("image")
    v["devicePlugin"].pop("extraArgs")
    v["devicePlugin"]["monitor"].pop("extraArgs")
    return v


def without(values: dict, *paths: str) -> dict:
    v = copy.deepcopy(values)
    for path in paths:
        *parents, leaf = path.split(".")
        node = v
        for p in parents:
            node = node[p]
        node.pop(leaf)
    return v


# (what is left in the file, the key the error must name, the offending value)
STEPS = [
    ((), "scheduler.kubeScheduler.extraArgs", "--policy-config-file=/config/config.json"),
    (("scheduler.kubeScheduler.extraArgs",), "scheduler.extender.extraArgs", "--debug"),
    (("scheduler.kubeScheduler.extraArgs", "scheduler.extender.extraArgs"), "devicePlugin.extraArgs", "-v=4"),
    (
        ("scheduler.kubeScheduler.extraArgs", "scheduler.extender.extraArgs", "devicePlugin.extraArgs"),
        "devicePlugin.monitor.extraArgs",
        "-v=4",
    ),
    (
        ("scheduler.kubeScheduler.extraArgs", "scheduler.extender.extraArgs", "devicePlugin.extraArgs",
         "devicePlugin.monitor.extraArgs"),
        "image.repository",
        "projecthami/hami",
    ),
    (
        ("scheduler.kubeScheduler.extraArgs", "scheduler.extender.extraArgs", "devicePlugin.extraArgs",
         "devicePlugin.monitor.extraArgs", "scheduler.extender.image", "devicePlugin.image"),
        "global.imageTag",
        "v2.10.0",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("removed", "key", "value"), STEPS, ids=[s[1] for s in STEPS])
def test_hami_flags_and_images_are_refused_naming_the_key(removed: tuple, key: str, value: str) -> None:
    with pytest.raises(helm_python.HelmRenderError) as e:
        render(without(HAMI_VALUES, *removed))
    assert key in str(e.value) and f'"{value}"' in str(e.value), str(e.value)


@pytest.mark.parametrize("kube_version", ["v1.23.0", "v1.30.0"])
def test_the_migrated_file_renders_validates_and_parses(kube_version: str) -> None:
    r = render(migrated(HAMI_VALUES), kube_version=kube_version)
    for o in r.objects:
        validate(o, kube_version)
    for _o, _spec, c in containers(r):
        command = c["command"][0]
        if command in FOREIGN:
            assert {a.split("=")[0] for a in c.get("args", []) if a.startswith("-")} <= FOREIGN[command]
        else:
            parsed(c)
    # HAMi's knobs that the file sets still arrive: nvidiaNodeSelector (HAMi's spelling), its webhook
    # policies (Ignore, Never: HAMi's defaults, which the file writes out).
    [dp] = r.find("DaemonSet", "hami-device-plugin")
    assert dp["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "on"}
    [w] = r.one("MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    assert (w["failurePolicy"], w["reinvocationPolicy"]) == ("Ignore", "Never")
    cfg = yaml.safe_load(r.one("ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"])
    assert cfg["nvidia"]["deviceSplitCount"] == 10 and cfg["nvidia"]["gpuCorePolicy"] == "default"


def _refused(component: str) -> list[str]:
    """The flags validate.yaml refuses in `component`'s extraArgs (its `has $flag (list ...)`)."""
    block = VALIDATE.split(f"range .Values.{component}.extraArgs" if component.startswith("devicePlugin") else
                           f"range $s.{component}.extraArgs")[1].split("{{- end }}")[0]  # fmt: skip
    [listed] = re.findall(r'\(list ((?:"[^"]+" ?)+)\)', block)
    return re.findall(r'"([^"]+)"', listed)


@pytest.mark.parametrize(
    ("component", "command", "listed"),
    [("extender", "hami-scheduler-extender", 5), ("devicePlugin", "hami-device-plugin", 5),
     ("devicePlugin.monitor", "hami-vgpu-monitor", 3)],
)  # fmt: skip
def test_the_chart_refuses_only_flags_our_parsers_reject(component: str, command: str, listed: int) -> None:
    # A refused flag that our parser accepted would block a valid install.
    refused = _refused(component)
    assert len(refused) >= listed, refused  # the list was found
    known = set(parser_for(command)._option_string_actions)  # noqa: SLF001 - the parser's own flag table
    assert not known & set(refused), known & set(refused)


def test_hamis_monitor_flag_would_crash_loop_the_monitor() -> None:
    # What the chart refuses: HAMi's `devicePlugin.monitor.extraArgs: [-v=4]` makes hami-vgpu-monitor exit 2.
    with pytest.raises(SystemExit) as e:
        parser_for("hami-vgpu-monitor").parse_args(["--node-name=n1", "-v=4"])
    assert e.value.code == 2


def test_our_own_flags_in_extra_args_still_pass() -> None:
    r = render({
        "scheduler": {"extender": {"extraArgs": ["--filter-mode", "all", "--kube-qps=50"]},
                      "kubeScheduler": {"extraArgs": ["-v=4"]}},
        "devicePlugin": {"extraArgs": ["-v"]},
    })  # fmt: skip
    [ext] = [c for _o, _s, c in containers(r) if c["name"] == "hami-scheduler-extender"]
    assert parsed(ext).filter_mode == "all"


@pytest.mark.parametrize(
    ("values", "where", "complaint"),
    [
        # kube-scheduler refuses a managedResources name without a domain and would not start.
        ({"resourceName": "gpu"}, "/resourceName", "'gpu' does not match pattern"),
        (
            {"devices": {"ascend": {"enabled": True, "customresources": ["Ascend910A"]}}},
            "/devices/ascend/customresources/0",
            "'Ascend910A' does not match pattern",
        ),
        # The API server rejects a pod whose pull secret is a bare string, after the release is half made.
        ({"global": {"imagePullSecrets": ["regcred"]}}, "/global/imagePullSecrets/0", "want object"),
        ({"imagePullSecrets": [{"nam": "regcred"}]}, "/imagePullSecrets/0", "missing property 'name'"),
        # A misspelt per-node key would be ignored without a word.
        (
            {"devicePlugin": {"nodeconfig": [{"name": "n1", "devicesplitcnt": 3}]}},
            "/devicePlugin/nodeconfig/0",
            "additional properties 'devicesplitcnt' not allowed",
        ),
    ],
    ids=["resource-without-domain", "customresource-without-domain", "pull-secret-string", "pull-secret-no-name",
         "nodeconfig-typo"],
)  # fmt: skip
def test_more_bad_values_are_refused_naming_the_key(values: dict, where: str, complaint: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as e:
        render(values)
    assert f"at '{where}'" in str(e.value) and complaint in str(e.value), str(e.value)


def test_hamis_per_node_keys_pass_in_any_case() -> None:
    # HAMi's device plugin decodes its per-node JSON with Go's case-insensitive matching.
    node = {"name": "n1", "deviceSplitCount": 3, "operatingmode": "hami-core", "filterdevices": {"uuid": []},
            "DeviceMemoryScaling": 1.5}  # fmt: skip
    r = render({"devicePlugin": {"nodeconfig": [node]}})
    cfg = yaml.safe_load(r.one("ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"])
    assert cfg["nodeconfig"] == [node]
    override = load_config(cfg).nodes["n1"]  # what the device plugin reads on node n1
    assert (override.deviceSplitCount, override.deviceMemoryScaling) == (3, 1.5)


def test_hamis_node_ports_and_service_annotations_survive_the_migration() -> None:
    # HAMi's values: NodePort Services on 31993 (scheduler) and 31992 (monitor), scraped on the nodes there.
    values = migrated(HAMI_VALUES)
    values["devicePlugin"]["service"]["annotations"] = {"prometheus.io/scrape": "true"}
    r = render(values)
    sched, mon = r.one("Service", "hami-scheduler"), r.one("Service", "hami-device-plugin-monitor")
    assert (sched["spec"]["type"], sched["spec"]["ports"][0]["nodePort"]) == ("NodePort", 31993)
    assert (mon["spec"]["type"], mon["spec"]["ports"][0]["nodePort"]) == ("NodePort", 31992)
    assert mon["metadata"]["annotations"] == {"prometheus.io/scrape": "true"}
    for o in (sched, mon):
        validate(o, "v1.30.0")


@pytest.mark.parametrize("service_type", ["ClusterIP", "NodePort"])
def test_a_port_outside_the_node_port_range_gets_no_fixed_node_port(service_type: str) -> None:
    r = render(
        {
            "scheduler": {"service": {"type": service_type}},
            "devicePlugin": {"service": {"type": service_type}},
        }
    )
    for name in ("hami-scheduler", "hami-device-plugin-monitor"):
        svc = r.one("Service", name)
        assert svc["spec"]["type"] == service_type and "nodePort" not in svc["spec"]["ports"][0], svc


@pytest.mark.parametrize("legacy", [True, False])
def test_hamis_legacy_metrics_key_reaches_the_monitor(legacy: bool) -> None:
    values = migrated(HAMI_VALUES)
    values["legacyMetrics"] = legacy
    [mon] = [c for _o, _s, c in containers(render(values)) if c["name"] == "hami-vgpu-monitor"]
    assert parsed(mon).legacy_metrics is legacy


@pytest.mark.parametrize(
    ("force", "takeover", "want"),
    [(True, None, "default-scheduler"), (False, None, ""), (False, "default-scheduler,volcano", "volcano")],
    ids=["hami-default", "force-off", "force-off-keeps-others"],
)
def test_hamis_force_overwrite_default_scheduler_reaches_the_webhook(
    force: bool, takeover, want: str
) -> None:
    values = migrated(HAMI_VALUES)
    values["scheduler"]["forceOverwriteDefaultScheduler"] = force
    if takeover:
        values["scheduler"]["admissionWebhook"]["takeoverSchedulers"] = takeover
    [hook] = [c for _o, _s, c in containers(render(values)) if c["name"] == "hami-webhook"]
    assert parsed(hook).takeover_schedulers == want


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"scheduler": {"nodeLabelSelector": {"gpu-pool": "a"}}}, "scheduler.nodeLabelSelector"),
        ({"global": {"managedNodeSelectorEnable": True, "managedNodeSelector": {"usage": "gpu"}}},
         "global.managedNodeSelectorEnable"),
    ],
    ids=["nodeLabelSelector", "managedNodeSelector"],
)  # fmt: skip
def test_hami_placement_knobs_we_lack_are_refused(values: dict, key: str) -> None:
    # Ignored, they would let GPU pods land on nodes the operator excluded.
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(key) + ":? .*not supported"):
        render(values)


def test_hamis_defaults_for_those_knobs_render() -> None:
    render({"scheduler": {"nodeLabelSelector": {}}, "global": {"managedNodeSelectorEnable": False}})


def _leaves(node: dict, prefix: str = ""):
    for k, v in node.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def _has(values: dict, path: str) -> bool:
    node = values
    for seg in path.split("."):
        if not isinstance(node, dict) or seg not in node:
            return False
        node = node[seg]
    return True


def test_every_key_of_hamis_file_is_honoured_or_listed() -> None:
    listed = {e["key"] for e in TABLE}
    missing = [
        key for key, _ in _leaves(HAMI_VALUES)
        if not _has(OURS, key) and not any(key == t or key.startswith(t + ".") for t in listed)
    ]  # fmt: skip
    assert not missing, f"HAMi keys neither in values.yaml nor in files/hami-keys.yaml: {missing}"
    # A listed key is not also one of ours (it would be refused while honoured).
    assert not [t for t in listed if _has(OURS, t)]


def _bad(entry: dict, hami_value):
    """A value of the type HAMi's file gives the key that `accept` does not contain."""
    if isinstance(hami_value, bool):
        return not hami_value
    if isinstance(hami_value, int):
        return 12345
    if isinstance(hami_value, list):
        return ["--not-accepted"]
    if isinstance(hami_value, dict):
        return {"notAccepted": "1"}
    return "not-accepted"


def _set(values: dict, path: str, value) -> dict:
    v = copy.deepcopy(values)
    *parents, leaf = path.split(".")
    node = v
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return v


REFUSED = [e for e in TABLE if e["accept"] != "any"]


@pytest.mark.parametrize("entry", REFUSED, ids=[e["key"] for e in REFUSED])
def test_a_hami_key_we_cannot_honour_is_refused_naming_it(entry: dict) -> None:
    node = HAMI_VALUES
    for seg in entry["key"].split("."):
        node = node.get(seg) if isinstance(node, dict) else None
    bad = _bad(entry, node)
    assert bad not in entry["accept"]
    with pytest.raises(helm_python.HelmRenderError) as e:
        render(_set(migrated(HAMI_VALUES), entry["key"], bad))
    assert f"{entry['key']}: " in str(e.value) and entry["why"] in str(e.value), str(e.value)


def test_hamis_node_selector_spelling_reaches_the_daemonset() -> None:
    # HAMi spells it nvidiaNodeSelector; a selector under another spelling would be ignored and the
    # plugin would run on nodes the operator excluded.
    values = migrated(HAMI_VALUES)
    values["devicePlugin"]["nvidiaNodeSelector"] = {"gpu": None, "nvidia.com/gpu.present": "true"}
    [dp] = render(values).find("DaemonSet", "hami-device-plugin")
    assert dp["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_hamis_device_config_content_replaces_the_built_file() -> None:
    content = "nvidia:\n  resourceCountName: nvidia.com/gpu\n  deviceSplitCount: 4\nscheduler:\n  enableAscend: false\n"
    values = _set(migrated(HAMI_VALUES), "device-config.content", content)
    data = render(values).one("ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"]
    assert data == content and load_config(yaml.safe_load(data)).nvidia.deviceSplitCount == 4
    with pytest.raises(helm_python.HelmRenderError, match="device-config.content: not"):
        render(_set(values, "device-config.content", "- a list\n"))


@pytest.mark.parametrize("vendor", sorted(OURS["devices"]))
def test_a_misspelt_vendor_key_is_refused(vendor: str) -> None:
    # `devices.ascend.enable: true` would otherwise leave Ascend off without a word.
    with pytest.raises(helm_python.HelmValuesError) as e:
        render({"devices": {vendor: {"enable": True}}})
    assert f"at '/devices/{vendor}'" in str(e.value) and "'enable' not allowed" in str(e.value), str(e.value)


def test_hamis_ascend_keys_render_and_hami_vnpu_core_arrives() -> None:
    values = migrated(HAMI_VALUES)
    values["devices"]["ascend"].update({"enabled": True, "hamiVnpuCore": True})
    r = render(values)
    cfg = yaml.safe_load(r.one("ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"])
    loaded = load_config(cfg)
    assert loaded.section("vnpus").hamiVnpuCore is True and loaded.scheduler.enableAscend is True
    ks = yaml.safe_load(r.one("ConfigMap", "hami-scheduler")["data"]["config.yaml"])
    assert "huawei.com/Ascend910B3-memory" in {m["name"] for m in ks["extenders"][0]["managedResources"]}
