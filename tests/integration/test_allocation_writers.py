"""Only HAMi writes allocation annotations after a pod is created: a pod owner's UPDATE or PATCH of
``hami.io/vgpu-devices-allocated`` / ``-to-allocate`` / ``bind-phase`` is refused, the scheduler's and the
device plugin's service accounts pass.

Both enforcement paths through the in-memory API server, configured from the rendered chart: the real
webhook registered for UPDATE (clusters without ValidatingAdmissionPolicy), and the chart's
ValidatingAdmissionPolicy evaluated by the API server itself (no webhook involved).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hami import annotations as A
from hami.errors import ApiError, HamiError
from hami.kube import KubeClient
from hami.registration import encode_node_devices_json
from kubefakes.apiserver import FakeApiServer
from kubefakes.apiserver.admission import service_account_user
from tests.builders import cards, gpu_node, gpu_pod
from tests.chart.render import NAMESPACE, Rendered, render
from tests.integration.extender_harness import Scheduler, create_pod, start_extender, wait_ready
from webhook import cli
from webhook.devcerts import make_ca, make_server_cert, write_pair

ALLOCATED = "GPU-a,NVIDIA,30000,30:;"
OWNER = {"username": "alice", "groups": ["system:authenticated", "team-a"]}


def _client(api: FakeApiServer, user: dict, path: Path) -> KubeClient:
    return KubeClient.from_kubeconfig(
        api.kubeconfig_for(user, str(path)), timeout_s=5.0, retries=1, retry_initial_wait_s=0.01
    )


def _pod() -> dict:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000", "nvidia.com/gpucores": "30"}
    return {
        "metadata": {"name": "train", "namespace": "team-a", "annotations": {"team": "a"}},
        "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]},
    }


@pytest.fixture
def clients(fake_apiserver: FakeApiServer, tmp_path: Path) -> dict[str, KubeClient]:
    made = {
        "owner": _client(fake_apiserver, OWNER, tmp_path / "owner"),
        "scheduler": _client(
            fake_apiserver, service_account_user(NAMESPACE, "hami-scheduler"), tmp_path / "s"
        ),
        "plugin": _client(
            fake_apiserver, service_account_user(NAMESPACE, "hami-device-plugin"), tmp_path / "d"
        ),
    }
    yield made
    for c in made.values():
        c.close()


def _placed(clients: dict[str, KubeClient]) -> None:
    """What the extender's filter writes (as the scheduler's service account)."""
    clients["scheduler"].patch_pod_metadata(
        "team-a", "train",
        annotations={A.ASSIGNED_NODE: "n1", A.NVIDIA_ALLOCATED: ALLOCATED, A.NVIDIA_TO_ALLOCATE: ALLOCATED},
    )  # fmt: skip


def _owner_is_refused(clients: dict[str, KubeClient], api: FakeApiServer, denial: str) -> None:
    owner = clients["owner"]
    for change in (
        {A.NVIDIA_ALLOCATED: "GPU-a,NVIDIA,1,30:;"},  # the extender would free 29999 MiB of the card
        {A.NVIDIA_TO_ALLOCATE: "GPU-a,NVIDIA,39000,100:;"},  # the plugin would serve a whole card
        {A.NVIDIA_ALLOCATED: None},  # removed: counted as nothing
        {A.BIND_PHASE: "allocating"},
    ):
        with pytest.raises(HamiError) as err:
            owner.patch_pod_metadata("team-a", "train", annotations=change)
        assert denial in str(err.value), str(err.value)
        assert next(iter(change)) in str(err.value) or "allocation annotations" in str(err.value)
    # A replace (PUT) of the whole pod with a changed allocation is refused the same way.
    pod = owner.get_pod("team-a", "train")
    pod["metadata"]["annotations"][A.NVIDIA_ALLOCATED] = "GPU-a,NVIDIA,1,30:;"
    with pytest.raises(HamiError) as err:
        owner.replace("pods", pod)
    assert denial in str(err.value)
    stored = A.pod_annotations(api.store.get("pods", "train", namespace="team-a"))
    assert stored[A.NVIDIA_ALLOCATED] == ALLOCATED and stored[A.NVIDIA_TO_ALLOCATE] == ALLOCATED
    # The owner's own annotations stay the owner's.
    owner.patch_pod_metadata("team-a", "train", annotations={"team": "b"})
    assert A.pod_annotations(api.store.get("pods", "train", namespace="team-a"))["team"] == "b"


def _plugin_may(clients: dict[str, KubeClient], api: FakeApiServer) -> None:
    clients["plugin"].patch_pod_metadata(
        "team-a", "train", annotations={A.NVIDIA_TO_ALLOCATE: ";", A.BIND_PHASE: "success"}
    )
    stored = A.pod_annotations(api.store.get("pods", "train", namespace="team-a"))
    assert stored[A.NVIDIA_TO_ALLOCATE] == ";" and stored[A.BIND_PHASE] == "success"


async def test_the_webhook_refuses_allocation_edits_by_the_pod_owner(
    fake_apiserver: FakeApiServer, clients, tmp_path: Path
) -> None:
    api = fake_apiserver
    rendered = render({}, kube_version="v1.29.0")  # no ValidatingAdmissionPolicy API served
    assert not rendered.find("ValidatingAdmissionPolicy")
    config = rendered.one("MutatingWebhookConfiguration", "hami-webhook")
    [hook] = config["webhooks"]
    assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    container = rendered.one("Deployment", "hami-webhook")["spec"]["template"]["spec"]["containers"][0]
    [writers] = [a for a in container["args"] if a.startswith("--allocation-writers=")]

    ca = make_ca()
    cert, key = write_pair(tmp_path, *make_server_cert(ca, dns_names=(f"hami-webhook.{NAMESPACE}.svc",)))
    options = cli.parse_args(
        ["--tls-cert-file", str(cert), "--tls-private-key-file", str(key), "--address", "127.0.0.1",
         "--port", "0", writers],
        env={},
    )  # fmt: skip
    running = await cli.start(options)
    try:
        hook["clientConfig"]["caBundle"] = base64.b64encode(ca.cert_pem).decode()
        api.admission.service_endpoints[(NAMESPACE, "hami-webhook")] = ("127.0.0.1", running.port)
        api.store.create("mutatingwebhookconfigurations", config)

        await asyncio.to_thread(clients["owner"].create_pod, _pod(), namespace="team-a")
        created = api.store.get("pods", "train", namespace="team-a")
        assert created["spec"]["schedulerName"] == "hami-scheduler"  # the webhook ran on CREATE
        await asyncio.to_thread(_placed, clients)
        calls = api.admission.calls
        await asyncio.to_thread(
            _owner_is_refused, clients, api, 'admission webhook "vgpu.hami.io" denied the request'
        )
        assert api.admission.calls > calls  # refused by the webhook, through the API server
        await asyncio.to_thread(_plugin_may, clients, api)
    finally:
        await running.stop()


def test_the_admission_policy_refuses_allocation_edits_without_the_webhook(
    fake_apiserver: FakeApiServer, clients
) -> None:
    api = fake_apiserver
    rendered = render(
        {}, kube_version="v1.30.0", api_versions=["admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"]
    )
    [hook] = rendered.one("MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    assert hook["rules"][0]["operations"] == ["CREATE"]  # the API server enforces it instead
    api.store.create(
        "validatingadmissionpolicies", rendered.one("ValidatingAdmissionPolicy", "hami-allocations")
    )
    api.store.create(
        "validatingadmissionpolicybindings",
        rendered.one("ValidatingAdmissionPolicyBinding", "hami-allocations"),
    )
    pod = _pod()
    pod["spec"]["schedulerName"] = "hami-scheduler"
    clients["owner"].create_pod(pod, namespace="team-a")
    _placed(clients)
    _owner_is_refused(
        clients, api, "ValidatingAdmissionPolicy 'hami-allocations' with binding 'hami-allocations' denied"
    )
    _plugin_may(clients, api)
    with pytest.raises(ApiError) as err:
        clients["owner"].patch_pod_metadata("team-a", "train", annotations={A.ASSIGNED_NODE: "n2"})
    assert err.value.status == 403


V1_POLICY = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"
OPTED_OUT = {"hami.io/webhook": "ignore"}
FORGED = {A.ASSIGNED_NODE: "n1", A.NVIDIA_ALLOCATED: "GPU-g-0,NVIDIA,40000,100:;"}


@contextlib.asynccontextmanager
async def _chart_admission(api: FakeApiServer, rendered: Rendered, tmp_path: Path) -> AsyncIterator[None]:
    """The real webhook serving the rendered chart's MutatingWebhookConfiguration (and its admission
    policy, where the chart renders one) through the in-memory API server."""
    for kind, resource in (
        ("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
        ("ValidatingAdmissionPolicyBinding", "validatingadmissionpolicybindings"),
    ):
        for obj in rendered.find(kind):
            api.store.create(resource, obj)
    config = rendered.one("MutatingWebhookConfiguration", "hami-webhook")
    container = rendered.one("Deployment", "hami-webhook")["spec"]["template"]["spec"]["containers"][0]
    [writers] = [a for a in container["args"] if a.startswith("--allocation-writers=")]
    ca = make_ca()
    cert, key = write_pair(tmp_path, *make_server_cert(ca, dns_names=(f"hami-webhook.{NAMESPACE}.svc",)))
    options = cli.parse_args(
        ["--tls-cert-file", str(cert), "--tls-private-key-file", str(key), "--address", "127.0.0.1",
         "--port", "0", writers],
        env={},
    )  # fmt: skip
    running = await cli.start(options)
    try:
        for hook in config["webhooks"]:
            hook["clientConfig"]["caBundle"] = base64.b64encode(ca.cert_pem).decode()
        api.admission.service_endpoints[(NAMESPACE, "hami-webhook")] = ("127.0.0.1", running.port)
        api.store.create("mutatingwebhookconfigurations", config)
        yield
    finally:
        await running.stop()
        # Gone again, so that what follows (the extender, as the admin) is not admitted.
        api.store.delete("mutatingwebhookconfigurations", "hami-webhook")
        for obj in rendered.find("ValidatingAdmissionPolicyBinding"):
            api.store.delete("validatingadmissionpolicybindings", obj["metadata"]["name"])


@pytest.mark.parametrize(
    ("kube", "apis"),
    [("v1.27.0", []), ("v1.29.0", []), ("v1.30.0", [V1_POLICY])],
    ids=["1.27", "1.29", "1.30"],
)
async def test_the_pod_opt_out_label_keeps_no_forged_allocation(
    fake_apiserver: FakeApiServer, clients, tmp_path: Path, session, kube: str, apis: list[str]
) -> None:
    # Any pod owner may label its own pod hami.io/webhook: ignore. That opts the pod out of the
    # webhook's changes, never out of the removal of allocation annotations: otherwise the owner
    # creates a pod that names the HAMi scheduler with a forged hami.io/vgpu-devices-allocated, and the
    # extender counts a card it never gave (here the whole 40000 MiB of GPU-g-0).
    api = fake_apiserver
    api.store.create("nodes", gpu_node("n1", cards("g", 1, mem=40000)))
    owner = clients["owner"]
    async with _chart_admission(api, render({}, kube_version=kube, api_versions=apis), tmp_path):
        decoy = gpu_pod("decoy", "team-a", gpus=0, annotations=FORGED)  # asks for no device at all
        decoy["metadata"]["labels"] = dict(OPTED_OUT)
        await asyncio.to_thread(owner.create_pod, decoy, namespace="team-a")
        stored = A.pod_annotations(api.store.get("pods", "decoy", namespace="team-a"))
        assert not set(FORGED) & set(stored), stored
        # The label still opts the pod out of everything else: no takeover of its scheduler.
        plain = gpu_pod("plain", "team-a", scheduler="default-scheduler")
        plain["metadata"]["labels"] = dict(OPTED_OUT)
        calls = api.admission.calls
        await asyncio.to_thread(owner.create_pod, plain, namespace="team-a")
        assert (
            api.store.get("pods", "plain", namespace="team-a")["spec"]["schedulerName"] == "default-scheduler"
        )
        if kube >= "v1.28":
            assert api.admission.calls == calls  # without allocation annotations it is not even sent
        # Adding the label later does not open the door for a change either.
        await asyncio.to_thread(owner.create_pod, _pod(), namespace="team-a")
        await asyncio.to_thread(_placed, clients)
        await asyncio.to_thread(
            owner.patch, "pods", "train", {"metadata": {"labels": OPTED_OUT}}, namespace="team-a"
        )
        with pytest.raises(HamiError):
            await asyncio.to_thread(
                owner.patch_pod_metadata,
                "team-a",
                "train",
                annotations={A.NVIDIA_ALLOCATED: "GPU-a,NVIDIA,1,30:;"},
            )
        assert (
            A.pod_annotations(api.store.get("pods", "train", namespace="team-a"))[A.NVIDIA_ALLOCATED]
            == ALLOCATED
        )
    server = await start_extender(api)
    try:
        await wait_ready(server)
        [stat] = [c for c in server.state.card_stats() if c.uuid == "GPU-g-0"]
        assert stat.usedmem == 0, stat
        result = await Scheduler(session, server.url).filter(create_pod(api, gpu_pod("b", mem=30000)), ["n1"])
        assert Scheduler.chosen(result) == ["n1"], result
    finally:
        await server.stop()


@pytest.mark.parametrize(("kube", "apis"), [("v1.29.0", []), ("v1.30.0", [V1_POLICY])], ids=["1.29", "1.30"])
async def test_the_status_subresource_is_no_way_around_the_guard(
    fake_apiserver: FakeApiServer, clients, tmp_path: Path, kube: str, apis: list[str]
) -> None:
    # pods/status writes the pod's labels and annotations too (kube-apiserver's podStatusStrategy keeps
    # only the spec): a user who may update it, as some controllers and operators are allowed to, must
    # not rewrite an allocation there either. The kubelet's own status updates pass, and on 1.28+ are
    # not sent to the webhook at all.
    api = fake_apiserver
    node_user = {"username": "system:node:n1", "groups": ["system:nodes", "system:authenticated"]}
    kubelet = _client(api, node_user, tmp_path / "kubelet")
    try:
        async with _chart_admission(api, render({}, kube_version=kube, api_versions=apis), tmp_path):
            await asyncio.to_thread(clients["owner"].create_pod, _pod(), namespace="team-a")
            await asyncio.to_thread(_placed, clients)
            for change in ({A.NVIDIA_ALLOCATED: "GPU-a,NVIDIA,1,30:;"}, {A.NVIDIA_ALLOCATED: None}):
                with pytest.raises(HamiError) as err:
                    await asyncio.to_thread(
                        clients["owner"].patch, "pods", "train", {"metadata": {"annotations": change}},
                        namespace="team-a", subresource="status",
                    )  # fmt: skip
                assert "allocation annotations" in str(err.value), str(err.value)
            stored = A.pod_annotations(api.store.get("pods", "train", namespace="team-a"))
            assert stored[A.NVIDIA_ALLOCATED] == ALLOCATED
            calls = api.admission.calls
            await asyncio.to_thread(kubelet.patch_pod_status, "team-a", "train", {"phase": "Running"})
            assert api.store.get("pods", "train", namespace="team-a")["status"]["phase"] == "Running"
            assert api.admission.calls == calls
    finally:
        kubelet.close()


async def test_a_nodes_device_plugin_token_writes_only_that_node_and_its_pods(
    fake_apiserver: FakeApiServer, clients, tmp_path: Path
) -> None:
    # The device plugin's service account may patch Nodes and pods cluster-wide (its ClusterRole), and
    # it is an allocation writer. Root on one node can read its pod's token: that must not let it
    # rewrite another node's registration (here: claim 400000 MiB on n2's card, so the scheduler
    # overcommits it) or the allocation of a pod bound to another node.
    api = fake_apiserver
    for name in ("n1", "n2"):
        api.store.create("nodes", gpu_node(name, cards(name, 1, mem=40000)))
    for name, node in (("on-n1", "n1"), ("on-n2", "n2")):
        pod = gpu_pod(name, "team-a", mem=1000)
        pod["spec"]["nodeName"] = node
        api.store.create("pods", pod)
    plugin_n1 = _client(
        api, service_account_user(NAMESPACE, "hami-device-plugin", node="n1"), tmp_path / "dp1"
    )
    rendered = render({}, kube_version="v1.30.0", api_versions=[V1_POLICY])
    forged = encode_node_devices_json([gpu_node_card("n2", mem=400000)])
    try:
        async with _chart_admission(api, rendered, tmp_path):
            with pytest.raises(ApiError) as err:
                await asyncio.to_thread(
                    plugin_n1.patch, "nodes", "n2", {"metadata": {"annotations": {A.NVIDIA_REGISTER: forged}}}
                )
            assert err.value.status == 403 and "only the Node it runs on" in str(err.value)
            with pytest.raises(ApiError) as err:
                await asyncio.to_thread(
                    plugin_n1.patch_pod_metadata, "team-a", "on-n2", annotations={A.BIND_PHASE: "success"}
                )
            assert err.value.status == 403 and "bound to the Node it runs on" in str(err.value)
            # Its own node and the pods bound there it writes as before.
            own = encode_node_devices_json([gpu_node_card("n1", mem=40000)])
            await asyncio.to_thread(
                plugin_n1.patch, "nodes", "n1", {"metadata": {"annotations": {A.NVIDIA_REGISTER: own}}}
            )
            await asyncio.to_thread(
                plugin_n1.patch_pod_metadata, "team-a", "on-n1", annotations={A.BIND_PHASE: "success"}
            )
        assert A.pod_annotations(api.store.get("nodes", "n2"))[A.NVIDIA_REGISTER] != forged
        assert (
            A.pod_annotations(api.store.get("pods", "on-n1", namespace="team-a"))[A.BIND_PHASE] == "success"
        )
    finally:
        plugin_n1.close()


def gpu_node_card(node: str, *, mem: int):  # noqa: ANN201 - a Device
    [card] = cards(node, 1, mem=mem)
    return card
