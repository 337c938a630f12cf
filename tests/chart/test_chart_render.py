"""helm/hami renders with the real Helm engine for Kubernetes 1.23-1.33, every object validates strictly
against that version's schema, `helm lint --strict` is clean, and each value set does what it says."""

from __future__ import annotations

import copy
import json

import helm_python
import pytest
import yaml

from tests.chart.conftest import SERVICE_MONITOR_API, VALUE_SETS, rendered
from tests.chart.render import CHART, KUBE_VERSIONS, NAMESPACE, render
from tests.chart.schemas import validate, validate_custom

POD_KINDS = ("Deployment", "DaemonSet", "Job")


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def scheduler_config(r) -> dict:
    return yaml.safe_load(r.one("ConfigMap", "hami-scheduler")["data"]["config.yaml"])


def test_every_object_validates_strictly(value_set: str, kube_version: str) -> None:
    r = rendered(value_set, kube_version)
    checked = []
    for o in r.objects:
        if validate(o, kube_version):
            checked.append(o["kind"])
        else:  # custom resources: no upstream schema, checked against the CRDs' field lists
            validate_custom(o)
    assert {"Deployment", "DaemonSet", "MutatingWebhookConfiguration", "ClusterRole"} <= set(checked)


def test_the_strict_validators_reject_an_unknown_field() -> None:
    bad = copy.deepcopy(rendered("defaults").one("Deployment", "hami-scheduler"))
    pod_spec(bad)["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(AssertionError, match="imagePullPolcy"):
        validate(bad, "v1.23.0")
    monitor = copy.deepcopy(rendered("servicemonitor").one("ServiceMonitor", "hami-scheduler"))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(AssertionError, match="intervall"):
        validate_custom(monitor)


@pytest.mark.parametrize(
    ("value_set", "kube_version"),
    [("defaults", v) for v in KUBE_VERSIONS]
    + [(s, "v1.30.0") for s in ("ha", "cert-manager", "second-vendor")],
)
def test_lint_strict_is_clean(value_set: str, kube_version: str) -> None:
    report = helm_python.lint(
        CHART, VALUE_SETS[value_set], strict=True, namespace=NAMESPACE, kube_version=kube_version
    )
    assert report["errors"] == [] and report["messages"] == [], report


def test_lint_strict_reports_a_broken_value() -> None:
    report = helm_python.lint(CHART, {"devicePlugin": {"deviceSplitCount": 0}}, strict=True)
    assert any("deviceSplitCount" in m["error"] for m in report["messages"]), report


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"scheduler": {"defaultSchedulerPolicy": {"nodeSchedulerPolicy": "pack"}}}, "nodeSchedulerPolicy"),
        (
            {"scheduler": {"defaultSchedulerPolicy": {"gpuSchedulerPolicy": "spread,fast"}}},
            "gpuSchedulerPolicy",
        ),
        ({"devicePlugin": {"deviceSplitCount": 0}}, "deviceSplitCount"),
        ({"devicePlugin": {"deviceMemoryScaling": -1}}, "deviceMemoryScaling"),
        ({"devicePlugin": {"deviceCoreScaling": 0}}, "deviceCoreScaling"),
        ({"devices": {"nvidai": {"enabled": True}}}, "nvidai"),
        ({"scheduler": {"admissionWebhook": {"failurePolicy": "ignore"}}}, "failurePolicy"),
    ],
    ids=[
        "nodeSchedulerPolicy",
        "gpuSchedulerPolicy",
        "deviceSplitCount",
        "deviceMemoryScaling",
        "deviceCoreScaling",
        "unknown-vendor",
        "failurePolicy",
    ],
)
def test_schema_rejects_bad_values_naming_the_key(values: dict, key: str) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=key):
        render(values)


def test_a_hami_values_file_passes_the_schema() -> None:
    # The HAMi keys an operator is most likely to carry over (see docs/install.md).
    hami = {
        "schedulerName": "hami-scheduler",
        "resourceName": "nvidia.com/gpu",
        "resourceMem": "nvidia.com/gpumem",
        "scheduler": {
            "leaderElect": True,
            "defaultSchedulerPolicy": {"nodeSchedulerPolicy": "spread", "gpuSchedulerPolicy": "binpack"},
            "admissionWebhook": {"failurePolicy": "Fail", "whitelistNamespaces": ["monitoring"]},
        },
        "devicePlugin": {
            "deviceSplitCount": 4,
            "deviceMemoryScaling": 1.5,
            "nvidiaNodeSelector": {"gpu": "on"},
        },
        "devices": {"nvidia": {"gpuCorePolicy": "force"}, "mthreads": {"enabled": True}},
        "global": {"imageRegistry": "registry.example.com"},
    }
    r = render(hami)
    assert r.one("MutatingWebhookConfiguration", "hami-webhook")["webhooks"][0]["failurePolicy"] == "Fail"


@pytest.mark.parametrize(
    ("kube_version", "api_version"),
    [("v1.23.0", "v1beta3"), ("v1.24.9", "v1beta3"), ("v1.25.0", "v1"), ("v1.28.0", "v1"), ("v1.33.0", "v1")],
)
def test_scheduler_config_api_version_follows_the_cluster(kube_version: str, api_version: str) -> None:
    cfg = scheduler_config(render(kube_version=kube_version))
    assert cfg["apiVersion"] == f"kubescheduler.config.k8s.io/{api_version}"
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    assert cfg["profiles"] == [{"schedulerName": "hami-scheduler"}]


# The extender stanza's fields, identical in v1beta3 and v1 (kube-scheduler decodes strictly).
EXTENDER_FIELDS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
    "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable",
}  # fmt: skip
CONFIG_FIELDS = {"apiVersion", "kind", "leaderElection", "profiles", "extenders", "clientConnection",
                 "parallelism", "percentageOfNodesToScore", "podInitialBackoffSeconds", "podMaxBackoffSeconds"}  # fmt: skip


def test_scheduler_config_has_only_known_fields_and_the_extender(value_set: str, kube_version: str) -> None:
    r = rendered(value_set, kube_version)
    cfg = scheduler_config(r)
    assert set(cfg) <= CONFIG_FIELDS
    assert set(cfg["leaderElection"]) == {"leaderElect", "resourceLock", "resourceName", "resourceNamespace"}
    [ext] = cfg["extenders"]
    assert set(ext) <= EXTENDER_FIELDS
    assert ext["filterVerb"] == "filter" and ext["bindVerb"] == "bind"
    assert ext["nodeCacheCapable"] is True and ext["enableHTTPS"] is False
    assert ext["httpTimeout"] == "30s"
    names = [m["name"] for m in ext["managedResources"]]
    assert len(names) == len(set(names)), "kube-scheduler refuses duplicate managedResources"
    assert all(m["ignoredByScheduler"] is True for m in ext["managedResources"])


@pytest.mark.parametrize("kube_version", ["v1.23.0", "v1.33.0"])
def test_preemption_counts_the_advertised_totals(kube_version: str) -> None:
    # The preempt verb is always configured; with scheduler.extender.preemption kube-scheduler counts
    # the memory and cores resources the extender advertises as the nodes' card totals.
    off = scheduler_config(render(kube_version=kube_version))["extenders"][0]
    assert off["preemptVerb"] == "preempt"
    r = render({"scheduler": {"extender": {"preemption": True}}}, kube_version=kube_version)
    [ext] = scheduler_config(r)["extenders"]
    counted = {m["name"] for m in ext["managedResources"] if not m["ignoredByScheduler"]}
    assert counted == {"nvidia.com/gpumem", "nvidia.com/gpucores"}
    deploy = r.one("Deployment", "hami-scheduler")
    [extender] = [c for c in pod_spec(deploy)["containers"] if c["name"] != "kube-scheduler"]
    assert "--advertise-node-resources" in extender["args"]


@pytest.mark.parametrize(
    ("kube_version", "tag"),
    [("v1.29.11-eks-1234", "v1.29.11"), ("v1.30.2-gke.1587003", "v1.30.2"), ("v1.23.17", "v1.23.17"),
     ("v1.31.1+k3s1", "v1.31.1")],
)  # fmt: skip
def test_kube_scheduler_image_follows_the_cluster_without_provider_suffix(
    kube_version: str, tag: str
) -> None:
    deploy = render(kube_version=kube_version).one("Deployment", "hami-scheduler")
    [ks] = [c for c in pod_spec(deploy)["containers"] if c["name"] == "kube-scheduler"]
    assert ks["image"] == f"registry.k8s.io/kube-scheduler:{tag}"


def test_clusters_before_1_23_are_refused() -> None:
    with pytest.raises(helm_python.HelmRenderError, match="needs 1.23 or later"):
        render(kube_version="v1.22.9")
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"] == ">=1.23.0-0"


@pytest.mark.parametrize(
    ("tag", "kube_version", "api_version"),
    [("v1.22.17", "v1.23.0", "v1beta2"), ("v1.23.17", "v1.24.0", "v1beta3"), ("v1.24.9", "v1.25.0", "v1beta3"),
     ("v1.25.0", "v1.25.3", "v1"), ("1.30.4", "v1.31.0", "v1"), ("v1.29.3-eks-1-29-1", "v1.29.11-eks-1234", "v1")],
)  # fmt: skip
def test_scheduler_config_api_version_follows_the_kube_scheduler_image(
    tag: str, kube_version: str, api_version: str
) -> None:
    # The image reads the configuration, not the cluster: a v1.22 kube-scheduler knows no v1beta3 or v1.
    r = render({"scheduler": {"kubeScheduler": {"image": {"tag": tag}}}}, kube_version=kube_version)
    cfg = scheduler_config(r)
    assert cfg["apiVersion"] == f"kubescheduler.config.k8s.io/{api_version}"
    # The Lease every version elects with is the one the chart's Role grants.
    assert cfg["leaderElection"]["resourceLock"] == "leases"
    role = r.one("Role", "hami-scheduler")
    named = [rule for rule in role["rules"] if rule.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": [cfg["leaderElection"]["resourceName"]], "verbs": ["get", "update"]}]  # fmt: skip


@pytest.mark.parametrize(
    ("tag", "kube_version"),
    [("v1.19.16", "v1.23.0"), ("v1.21.14", "v1.23.0"), ("v1.22.17", "v1.30.0"), ("v1.31.0", "v1.30.0"),
     ("v1.26.0", "v1.28.0"), ("latest", "v1.30.0"), ("v2.0.0", "v1.30.0")],
)  # fmt: skip
def test_kube_scheduler_versions_outside_the_supported_range_are_refused(tag: str, kube_version: str) -> None:
    with pytest.raises(helm_python.HelmRenderError) as e:
        render({"scheduler": {"kubeScheduler": {"image": {"tag": tag}}}}, kube_version=kube_version)
    assert f'scheduler.kubeScheduler.image.tag: "{tag}"' in str(e.value), str(e.value)


def test_kube_scheduler_tag_is_overridable() -> None:
    deploy = render({"scheduler": {"kubeScheduler": {"image": {"tag": "v1.29.4"}}}}).one(
        "Deployment", "hami-scheduler"
    )
    assert pod_spec(deploy)["containers"][0]["image"] == "registry.k8s.io/kube-scheduler:v1.29.4"


def test_our_images_follow_app_version_and_global_tag() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    images = {c["image"] for o in rendered("defaults").objects if o["kind"] in POD_KINDS
              for c in pod_spec(o)["containers"] + pod_spec(o).get("initContainers", [])}  # fmt: skip
    assert f"ghcr.io/hami-legacy/hami:{app_version}" in images
    assert f"ghcr.io/hami-legacy/hami-device-plugin:{app_version}" in images
    tagged = render({"global": {"imageTag": "9.9.9"}}).one("DaemonSet", "hami-device-plugin")
    assert pod_spec(tagged)["containers"][0]["image"] == "ghcr.io/hami-legacy/hami-device-plugin:9.9.9"


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"global": {"imageTag": "v2.10.0"}}, "global.imageTag"),
        ({"global": {"imageTag": "v2.8.1-rc.1"}}, "global.imageTag"),
        ({"devicePlugin": {"image": {"tag": "v2.10.0"}}}, "devicePlugin.image.tag"),
        ({"scheduler": {"extender": {"image": {"tag": "v2.9.0"}}}}, "scheduler.extender.image.tag"),
    ],
    ids=["global", "global-rc", "device-plugin", "extender"],
)
def test_a_hami_release_tag_for_our_images_is_refused(values: dict, key: str) -> None:
    # HAMi's values file sets global.imageTag: "v2.10.0"; our images carry no such tag (ImagePullBackOff).
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    with pytest.raises(helm_python.HelmRenderError) as e:
        render(values)
    message = str(e.value)
    assert f"{key}: " in message and "HAMi release tag" in message and f'"{app_version}"' in message, message


def test_tags_of_our_own_builds_pass() -> None:
    for tag in ("0.1.0", "0.1.0-rc1", "v0.2.0", "2.10.0-local", "sha-1234abc"):
        tagged = render({"global": {"imageTag": tag}}).one("DaemonSet", "hami-device-plugin")
        assert pod_spec(tagged)["containers"][0]["image"].endswith(f":{tag}")


def test_defaults_single_scheduler_without_pdb() -> None:
    r = rendered("defaults")
    assert r.one("Deployment", "hami-scheduler")["spec"]["replicas"] == 1
    # The webhook alone has two replicas and a budget (failurePolicy Fail: tests/chart/test_chart_webhook.py).
    assert [o["metadata"]["name"] for o in r.find("PodDisruptionBudget")] == ["hami-webhook"]
    # Leader election stays on (HAMi's scheduler.leaderElect default): a rolling update briefly runs
    # two kube-schedulers, and only one may schedule.
    assert scheduler_config(r)["leaderElection"]["leaderElect"] is True


def test_ha_turns_on_leader_election_pdb_and_anti_affinity() -> None:
    r = rendered("ha")
    deploy = r.one("Deployment", "hami-scheduler")
    assert deploy["spec"]["replicas"] == 2
    assert scheduler_config(r)["leaderElection"] == {
        "leaderElect": True, "resourceLock": "leases", "resourceName": "hami-scheduler", "resourceNamespace": NAMESPACE,
    }  # fmt: skip
    for name in ("hami-scheduler", "hami-webhook"):
        pdb = r.one("PodDisruptionBudget", name)
        assert pdb["spec"]["minAvailable"] == 1
        target = r.one("Deployment", name)
        assert pdb["spec"]["selector"]["matchLabels"] == target["spec"]["selector"]["matchLabels"]
        term = pod_spec(target)["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ][0]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        assert (
            term["podAffinityTerm"]["labelSelector"]["matchLabels"]
            == target["spec"]["selector"]["matchLabels"]
        )
    # --leader-elect=false, replicas 1: no election at all.
    cfg = scheduler_config(render({"scheduler": {"leaderElect": False}}))
    assert cfg["leaderElection"]["leaderElect"] is False


def test_scheduler_pod_probes_labels_and_priority() -> None:
    deploy = rendered("defaults").one("Deployment", "hami-scheduler")
    spec = pod_spec(deploy)
    assert deploy["spec"]["template"]["metadata"]["labels"]["hami.io/webhook"] == "ignore"
    assert spec["priorityClassName"] == "system-cluster-critical"
    [ext] = [c for c in spec["containers"] if c["name"] == "hami-scheduler-extender"]
    assert ext["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert ext["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    custom = render({"scheduler": {"priorityClassName": "gpu-critical"}}).one("Deployment", "hami-scheduler")
    assert pod_spec(custom)["priorityClassName"] == "gpu-critical"


def test_every_pod_of_ours_is_ignored_by_the_webhook(value_set: str) -> None:
    for o in rendered(value_set).objects:
        if o["kind"] in POD_KINDS:
            assert o["spec"]["template"]["metadata"]["labels"]["hami.io/webhook"] == "ignore", o["metadata"][
                "name"
            ]


def test_webhook_configuration() -> None:
    mwc = rendered("defaults").one("MutatingWebhookConfiguration", "hami-webhook")
    [w] = mwc["webhooks"]
    assert w["admissionReviewVersions"] == ["v1", "v1beta1"]
    assert w["sideEffects"] == "None" and w["failurePolicy"] == "Fail"
    assert w["rules"] == [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"], "scope": "Namespaced"},
                          {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods/status"], "scope": "Namespaced"}]  # fmt: skip
    ns = {e["key"]: e for e in w["namespaceSelector"]["matchExpressions"]}
    assert ns["hami.io/webhook"] == {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}
    assert ns["kubernetes.io/metadata.name"]["operator"] == "NotIn"
    assert {NAMESPACE, "kube-system"} <= set(ns["kubernetes.io/metadata.name"]["values"])
    # No pod-label term: a pod owner sets hami.io/webhook: ignore, and such a pod must still lose its
    # forged allocation annotations (the matchConditions send it only while it carries one).
    assert "objectSelector" not in w
    assert "opted-out-pods-only-with-allocation-annotations" in [c["name"] for c in w["matchConditions"]]
    assert "caBundle" not in w["clientConfig"], "the certificate job fills it in (no CA at render time)"
    extra = render({"scheduler": {"admissionWebhook": {"whitelistNamespaces": ["monitoring"]}}})
    [w2] = extra.one("MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    assert "monitoring" in w2["namespaceSelector"]["matchExpressions"][1]["values"]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_match_conditions_only_where_the_api_has_them(kube_version: str) -> None:
    webhooks = rendered("defaults", kube_version).one("MutatingWebhookConfiguration", "hami-webhook")[
        "webhooks"
    ]
    assert [("matchConditions" in w) for w in webhooks] == (
        [True] if kube_version >= "v1.28" else [False, False]  # Fail where opted in, Ignore elsewhere
    )


def _cel(expression: str, pod: dict) -> bool:
    import celpy

    env = celpy.Environment()
    program = env.program(env.compile(expression))
    return bool(program.evaluate({"object": celpy.json_to_cel(pod)}))


def test_match_condition_selects_device_pods_and_hami_annotations() -> None:
    [w] = rendered("second-vendor").one("MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    expr = w["matchConditions"][0]["expression"]

    def pod(limits=None, annotations=None, init=False):
        c = {"name": "c", "resources": {"limits": limits}} if limits else {"name": "c"}
        spec = {"containers": [{"name": "main"}], "initContainers": [c]} if init else {"containers": [c]}
        return {"metadata": {"annotations": annotations} if annotations else {}, "spec": spec}

    assert _cel(expr, pod({"nvidia.com/gpu": 1}))
    assert _cel(expr, pod({"nvidia.com/gpumem": 1000}, init=True))
    assert _cel(expr, pod({"cambricon.com/vmlu": 1}))
    assert _cel(expr, pod({"hygon.com/dcunum": 1}))
    assert _cel(expr, pod({"cpu": 1}, annotations={"hami.io/vgpu-devices-allocated": "x"}))
    assert not _cel(expr, pod({"cpu": 1, "memory": "1Gi"}))
    assert not _cel(expr, pod(annotations={"example.com/x": "y"}))


def test_default_certificates_come_from_our_hook_jobs() -> None:
    r = rendered("defaults")
    create, patch = r.one("Job", "hami-certgen-create"), r.one("Job", "hami-certgen-patch")
    assert create["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert patch["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    for kind in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
        hook = r.one(kind, "hami-certgen")["metadata"]["annotations"]
        assert int(hook["helm.sh/hook-weight"]) < int(
            create["metadata"]["annotations"]["helm.sh/hook-weight"]
        )
    args = pod_spec(create)["containers"][0]["args"]
    assert "--secret-name=hami-webhook-tls" in args
    hosts = next(a for a in args if a.startswith("--hosts=")).split("=", 1)[1].split(",")
    assert f"hami-webhook.{NAMESPACE}.svc" in hosts
    webhook = r.one("Deployment", "hami-webhook")
    [tls] = [v for v in pod_spec(webhook)["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == "hami-webhook-tls"
    assert r.find("Certificate") == [] and r.find("Secret") == []
    assert not any("genCA" in text for text in r.files.values())


def test_cert_manager_replaces_the_jobs() -> None:
    r = rendered("cert-manager")
    assert r.find("Job") == []
    cert = r.one("Certificate", "hami-webhook")
    assert cert["apiVersion"] == "cert-manager.io/v1"
    assert cert["spec"]["secretName"] == "hami-webhook-tls"
    assert f"hami-webhook.{NAMESPACE}.svc" in cert["spec"]["dnsNames"]
    assert cert["spec"]["issuerRef"] == {"kind": "Issuer", "name": "hami-webhook"}
    assert r.one("Issuer", "hami-webhook")["spec"] == {"selfSigned": {}}
    mwc = r.one("MutatingWebhookConfiguration", "hami-webhook")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/hami-webhook"


def test_service_monitor_only_when_enabled_and_served() -> None:
    on = rendered("servicemonitor")
    monitors = {o["metadata"]["name"]: o for o in on.find("ServiceMonitor")}
    assert set(monitors) == {"hami-scheduler", "hami-device-plugin-monitor"}
    for m in monitors.values():
        assert m["apiVersion"] == SERVICE_MONITOR_API
        assert m["metadata"]["labels"]["release"] == "prometheus"
        [ep] = m["spec"]["endpoints"]
        svc = on.one("Service", m["metadata"]["name"])
        assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]} and ep["path"] == "/metrics"
        assert m["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    not_served = render(VALUE_SETS["servicemonitor"], api_versions=[])
    assert not_served.find("ServiceMonitor") == []
    assert rendered("defaults").find("ServiceMonitor") == []


def test_private_registry_reaches_every_image_and_pod() -> None:
    r = rendered("private-registry")
    pods = [o for o in r.objects if o["kind"] in POD_KINDS]
    assert len(pods) == 5
    for o in pods:
        spec = pod_spec(o)
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["image"].startswith("registry.example.com/"), (o["metadata"]["name"], c["image"])
        assert {"name": "regcred"} in spec["imagePullSecrets"]


def test_device_plugin_daemonset() -> None:
    ds = rendered("defaults").one("DaemonSet", "hami-device-plugin")
    spec = pod_spec(ds)
    assert spec["nodeSelector"] == {"gpu": "on"}
    assert spec["hostPID"] is True, "the monitor reads the host's /proc"
    no_monitor = pod_spec(
        render({"devicePlugin": {"monitor": {"enabled": False}}}).one("DaemonSet", "hami-device-plugin")
    )
    assert no_monitor["hostPID"] is False and len(no_monitor["containers"]) == 1
    names = [c["name"] for c in spec["containers"]]
    assert names == ["hami-device-plugin", "hami-vgpu-monitor"]
    dp = spec["containers"][0]
    env = {e["name"]: e for e in dp["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in dp["volumeMounts"]}
    assert (
        volumes["device-plugin"]["hostPath"]["path"]
        == mounts["device-plugin"]
        == "/var/lib/kubelet/device-plugins"
    )
    assert volumes["vgpu"]["hostPath"] == {"path": "/usr/local/vgpu", "type": "DirectoryOrCreate"}
    assert mounts["vgpu"] == "/usr/local/vgpu"
    [init] = spec["initContainers"]
    assert init["command"] == ["/usr/local/bin/vgpu-init.sh"] and init["args"] == ["/usr/local/vgpu"]
    tol = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # Helm merges maps: null removes the default gpu=on label.
    selector = {"accelerator": "nvidia", "gpu": None}
    custom = render({"devicePlugin": {"tolerations": tol, "nvidiaNodeSelector": selector}})
    cspec = pod_spec(custom.one("DaemonSet", "hami-device-plugin"))
    assert cspec["tolerations"] == tol and cspec["nodeSelector"] == {"accelerator": "nvidia"}


def test_runtime_class_reaches_the_device_plugin_pod_too() -> None:
    # On a node whose default runtime is runc, only the NVIDIA runtime gives the plugin and the monitor
    # (one pod) libnvidia-ml and the cards: HAMi's chart sets it on its DaemonSet as well.
    assert "runtimeClassName" not in pod_spec(rendered("defaults").one("DaemonSet", "hami-device-plugin"))
    r = render({"devicePlugin": {"runtimeClassName": "nvidia", "createRuntimeClass": True}})
    assert pod_spec(r.one("DaemonSet", "hami-device-plugin"))["runtimeClassName"] == "nvidia"
    assert r.one("RuntimeClass", "nvidia")["handler"] == "nvidia"
    cfg = yaml.safe_load(r.one("ConfigMap", "hami-scheduler-device")["data"]["device-config.yaml"])
    assert cfg["nvidia"]["runtimeClassName"] == "nvidia"  # and the webhook gives it to GPU pods
    for o in r.objects:
        validate(o, "v1.30.0")


def test_lib_path_must_sit_under_the_hook_path() -> None:
    with pytest.raises(helm_python.HelmRenderError, match="libPath"):
        render({"devicePlugin": {"libPath": "/opt/vgpu"}})
    moved = render({"global": {"gpuHookPath": "/opt"}, "devicePlugin": {"libPath": "/opt/vgpu"}})
    dp = pod_spec(moved.one("DaemonSet", "hami-device-plugin"))["containers"][0]
    assert "--hook-path=/opt" in dp["args"]


def test_notes_tell_the_next_steps() -> None:
    notes = rendered("defaults").notes
    assert "kubectl label node <gpu-node> gpu=on" in notes
    assert "hami-scheduler" in notes


def test_values_are_valid_json_for_the_schema_itself() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(defaults) <= set(schema["properties"]), set(defaults) - set(schema["properties"])


def test_schema_policies_are_the_schedulers_policies() -> None:
    # The chart must accept every policy the scheduler's parser accepts (and no other), or a valid
    # value such as `fragmentation` is refused at install time.
    from hami.scoring import CARD_POLICIES, NODE_POLICIES

    props = json.loads((CHART / "values.schema.json").read_text())["properties"]["scheduler"]["properties"]
    policy = props["defaultSchedulerPolicy"]["properties"]
    assert set(policy["nodeSchedulerPolicy"]["enum"]) == set(NODE_POLICIES)
    names = policy["gpuSchedulerPolicy"]["pattern"].split(")(")[0].lstrip("^(").split("|")
    assert set(names) == set(CARD_POLICIES)
    for chain in ["fragmentation", "topology-aware,fragmentation", *CARD_POLICIES]:
        render({"scheduler": {"defaultSchedulerPolicy": {"gpuSchedulerPolicy": chain}}})
    render({"scheduler": {"defaultSchedulerPolicy": {"nodeSchedulerPolicy": "fragmentation"}}})
