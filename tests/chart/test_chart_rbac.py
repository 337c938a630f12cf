"""RBAC covers every API call the code makes, and nothing more.

`CALLS` is the table: for each component, every (API group, resource, verb) it needs and the call in
the code that needs it. Two checks keep it honest:
- the table equals what a scan of the component's code finds (every `KubeClient` method, `Reflector`
  and `LeaderElector` it uses, mapped through `METHODS`), so a new API call without an RBAC rule, or a
  rule whose call was removed, fails here;
- the rules the chart renders for the component's ServiceAccount equal the table (no wildcards, no
  extra verbs, no Secrets outside the certificate job).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from hami.kube import KubeClient
from tests.chart.conftest import rendered
from tests.chart.render import NAMESPACE, ROOT, render

Perm = tuple[str, str, str]  # (apiGroup, resource, verb)

# KubeClient method -> what it sends (hami/kube/client.py). bind_pod reads and patches the pod when the
# Binding conflicts (an earlier try that timed out); create_event patches an Event to bump its count.
METHODS: dict[str, set[Perm]] = {
    "get_node": {("", "nodes", "get")},
    "list_nodes": {("", "nodes", "list")},
    "patch_node_annotations": {("", "nodes", "patch")},
    "patch_node_labels": {("", "nodes", "patch")},
    "get_pod": {("", "pods", "get")},
    "list_pods": {("", "pods", "list")},
    "patch_pod_metadata": {("", "pods", "patch")},
    "patch_pod_status": {("", "pods/status", "patch")},
    "create_pod": {("", "pods", "create")},
    "delete_pod": {("", "pods", "delete")},
    "bind_pod": {("", "pods/binding", "create"), ("", "pods", "get"), ("", "pods", "patch")},
    "create_event": {("", "events", "create"), ("", "events", "patch")},
    "list_resource_quotas": {("", "resourcequotas", "list")},
    "get_lease": {("coordination.k8s.io", "leases", "get")},
    "create_lease": {("coordination.k8s.io", "leases", "create")},
    "update_lease": {("coordination.k8s.io", "leases", "update")},
}
# The hot path's coroutines send the same requests as their synchronous twins.
METHODS |= {f"a{name}": METHODS[name] for name in ("bind_pod", "create_event", "patch_node_annotations",
                                                   "patch_pod_metadata")}  # fmt: skip
# Generic methods take the resource as their first argument.
GENERIC = {"get": "get", "list": "list", "list_with_version": "list", "create": "create", "patch": "patch",
           "replace": "update", "delete": "delete", "watch": "watch", "aget": "get", "acreate": "create",
           "apatch": "patch"}  # fmt: skip
GROUPS = {"leases": "coordination.k8s.io", "poddisruptionbudgets": "policy"}
LEADER_ELECTOR = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}

# component -> (code it runs, ServiceAccount, the table with the call that needs each permission)
CALLS: dict[str, tuple[list[str], str, dict[Perm, str]]] = {
    "extender": (
        ["scheduler_extender", "hami/nodelock.py", "hami/handshake.py"],
        "hami-scheduler",
        {
            ("", "nodes", "list"): "sync.py Reflector(nodes)",
            ("", "nodes", "watch"): "sync.py Reflector(nodes)",
            ("", "nodes", "get"): "nodelock.py get_node (lock read before the conditional write)",
            ("", "nodes", "patch"): "nodelock.py lock/release, sync.py handshake stamps",
            ("", "pods", "list"): "sync.py Reflector(pods)",
            ("", "pods", "watch"): "sync.py Reflector(pods)",
            ("", "pods", "get"): "service.py get_pod, nodelock.py lock owner check",
            ("", "pods", "patch"): "service.py placement annotations",
            ("", "pods/binding", "create"): "service.py bind_pod",
            ("", "resourcequotas", "list"): "sync.py Reflector(resourcequotas)",
            ("", "resourcequotas", "watch"): "sync.py Reflector(resourcequotas)",
            ("", "events", "create"): "cli.py/app.py EventSink -> create_event",
            ("", "events", "patch"): "create_event bumps the count of a repeated event",
            ("policy", "poddisruptionbudgets", "list"): "preempting.py the budgets, per preempt call",
            ("", "nodes/status", "patch"): "advertise.py card totals (scheduler.extender.preemption only)",
        },
    ),
    "webhook": (
        ["webhook"],
        "hami-webhook",
        {
            ("", "resourcequotas", "list"): "cache.py Reflector(resourcequotas)",
            ("", "resourcequotas", "watch"): "cache.py Reflector(resourcequotas)",
            ("", "namespaces", "list"): "cache.py Reflector(namespaces)",
            ("", "namespaces", "watch"): "cache.py Reflector(namespaces)",
        },
    ),
    "device-plugin": (
        ["device_plugin", "device_plugin/monitor"],
        "hami-device-plugin",
        {
            ("", "nodes", "get"): "node_register.py / allocator.py get_node",
            ("", "nodes", "patch"): "node_register.py registration and handshake annotations",
            ("", "pods", "get"): "allocator.py get_pod (the lock's pod)",
            ("", "pods", "patch"): "allocator.py bind-phase annotations",
            ("", "pods", "list"): "allocator.py this node's pods (Allocate after a reboot); monitor/app.py, "
            "monitor Reflector(pods)",
            ("", "pods", "watch"): "monitor Reflector(pods)",
            ("", "events", "create"): "allocator.py CardMismatch warning",
            ("", "events", "patch"): "allocator.py CardMismatch warning (repeat count)",
        },
    ),
}

# Leader election of the extender itself is off in the chart (kube-scheduler elects; see docs/install.md),
# so LeaderElector's lease calls in scheduler_extender/runtime.py are not granted to it.
NOT_USED_BY_CHART = {"extender": LEADER_ELECTOR}
# Permissions the chart grants only with a value set: (component, permission) -> the values.
WITH_VALUES: dict[tuple[str, Perm], dict] = {
    ("extender", ("", "nodes/status", "patch")): {"scheduler": {"extender": {"preemption": True}}},
}


def _files(paths: list[str]) -> list[Path]:
    out = []
    for p in paths:
        path = ROOT / p
        if path.is_dir():
            # A package's subpackages are scanned with their own entry (the monitor) or not at all.
            out += sorted(path.glob("*.py"))
        elif path.exists():
            out.append(path)
    return out


def scan(paths: list[str]) -> dict[Perm, list[str]]:
    """Every permission the code under `paths` needs, with where: {perm: ["file:line name"]}."""
    found: dict[Perm, list[str]] = {}

    def add(perms: set[Perm], where: str) -> None:
        for perm in perms:
            found.setdefault(perm, []).append(where)

    for path in _files(paths):
        rel = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in METHODS:
                add(METHODS[node.attr], f"{rel}:{node.lineno} {node.attr}")
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            literal = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if name == "Reflector" and literal:
                res = literal[0]
                add(
                    {(GROUPS.get(res, ""), res, "list"), (GROUPS.get(res, ""), res, "watch")},
                    f"{rel}:{node.lineno} Reflector",
                )
            elif name == "LeaderElector":
                add(LEADER_ELECTOR, f"{rel}:{node.lineno} LeaderElector")
            elif (
                name in GENERIC
                and isinstance(node.func, ast.Attribute)
                and any(w in ast.unparse(node.func.value) for w in ("kube", "client"))
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value
                in (
                    "pods",
                    "nodes",
                    "events",
                    "resourcequotas",
                    "namespaces",
                    "leases",
                    "poddisruptionbudgets",
                )
            ):
                res = node.args[0].value
                sub = [
                    k.value.value
                    for k in node.keywords
                    if k.arg == "subresource" and isinstance(k.value, ast.Constant)
                ]
                target = f"{res}/{sub[0]}" if sub and sub[0] else res
                add({(GROUPS.get(res, ""), target, GENERIC[name])}, f"{rel}:{node.lineno} {name}({target!r})")
    return found


def rendered_rules(r, service_account: str) -> set[Perm]:
    """Every (group, resource, verb) the ServiceAccount gets through Roles/ClusterRoles of the chart."""
    perms: set[Perm] = set()
    for binding in r.find("ClusterRoleBinding") + r.find("RoleBinding"):
        if not any(
            s["kind"] == "ServiceAccount" and s["name"] == service_account for s in binding["subjects"]
        ):
            continue
        ref = binding["roleRef"]
        roles = r.find(ref["kind"], ref["name"])
        if not roles:
            continue  # a built-in role (kube-scheduler's), checked below
        for rule in roles[0]["rules"]:
            for g in rule["apiGroups"]:
                for res in rule["resources"]:
                    for verb in rule["verbs"]:
                        perms.add((g, res, verb))
    return perms


def test_every_client_method_is_in_the_table() -> None:
    public = {n for n, _ in inspect.getmembers(KubeClient, inspect.isfunction) if not n.startswith("_")}
    unknown = public - set(METHODS) - set(GENERIC) - {"close", "aclose", "from_kubeconfig", "in_cluster"}
    assert not unknown, f"new KubeClient methods need an RBAC mapping here: {sorted(unknown)}"


@pytest.mark.parametrize("component", list(CALLS))
def test_table_matches_the_code(component: str) -> None:
    paths, _sa, table = CALLS[component]
    found = scan(paths)
    needed = set(found) - NOT_USED_BY_CHART.get(component, set())
    missing = needed - set(table)
    assert not missing, {p: found[p] for p in missing}
    unused = set(table) - set(found)
    assert not unused, f"{component}: the table grants what no code calls: {sorted(unused)}"


@pytest.mark.parametrize("component", list(CALLS))
def test_rendered_rules_are_exactly_the_table(component: str) -> None:
    _paths, sa, table = CALLS[component]
    got = rendered_rules(rendered("defaults"), sa)
    got = (
        {p for p in got if p[1] != "leases"} if component == "extender" else got
    )  # kube-scheduler's Lease below
    want = set(table) - {p for (c, p) in WITH_VALUES if c == component}
    assert got == want, {"extra": sorted(got - want), "missing": sorted(want - got)}


@pytest.mark.parametrize(("component", "perm"), list(WITH_VALUES))
def test_rules_that_follow_a_value_are_granted_with_it(component: str, perm: Perm) -> None:
    _paths, sa, _table = CALLS[component]
    assert perm in rendered_rules(render(WITH_VALUES[(component, perm)]), sa)


def test_no_wildcards_and_no_cluster_wide_secrets(value_set: str) -> None:
    r = rendered(value_set)
    for role in r.find("ClusterRole") + r.find("Role"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], (role["metadata"]["name"], rule)
            if "secrets" in rule["resources"]:
                assert role["kind"] == "Role" and role["metadata"]["name"] == "hami-certgen", role["metadata"]
                assert set(rule["verbs"]) <= {"create", "get"}


def test_kube_scheduler_gets_its_builtin_roles_and_its_own_lease() -> None:
    r = rendered("defaults")
    builtin = {
        b["roleRef"]["name"]
        for b in r.find("ClusterRoleBinding")
        if any(s["name"] == "hami-scheduler" for s in b["subjects"])
        and not r.find("ClusterRole", b["roleRef"]["name"])
    }
    assert builtin == {"system:kube-scheduler", "system:volume-scheduler"}
    role = r.one("Role", "hami-scheduler")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert {(tuple(x.get("resourceNames", [])), tuple(x["verbs"])) for x in role["rules"]} == {
        ((), ("create",)), (("hami-scheduler",), ("get", "update")),
    }  # fmt: skip
    reader = r.one("RoleBinding", "hami-scheduler-auth-reader")
    assert reader["metadata"]["namespace"] == "kube-system"
    assert reader["roleRef"]["name"] == "extension-apiserver-authentication-reader"


def test_certgen_rules_are_named_objects_only() -> None:
    r = rendered("defaults")
    [cluster_rule] = r.one("ClusterRole", "hami-certgen")["rules"]
    assert cluster_rule == {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
                            "resourceNames": ["hami-webhook"], "verbs": ["get", "patch"]}  # fmt: skip
    rules = r.one("Role", "hami-certgen")["rules"]
    assert {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": ["hami-webhook-tls"],
        "verbs": ["get"],
    } in rules
    assert (
        r.find("ClusterRole", "hami-certgen")
        and rendered("cert-manager").find("ClusterRole", "hami-certgen") == []
    )


def test_switching_parts_off_removes_their_rights() -> None:
    r = render(
        {
            "scheduler": {"admissionWebhook": {"quotaCheck": False}},
            "devicePlugin": {"monitor": {"enabled": False}},
        }
    )
    assert r.find("ClusterRole", "hami-webhook") == []
    assert rendered_rules(r, "hami-device-plugin") == {
        ("", "nodes", "get"), ("", "nodes", "patch"), ("", "pods", "get"), ("", "pods", "patch"),
        ("", "pods", "list"), ("", "events", "create"), ("", "events", "patch"),
    }  # fmt: skip
