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
from pathlib import Path

import pytest

from hami import annotations as A
from hami.errors import ApiError, HamiError
from hami.kube import KubeClient
from kubefakes.apiserver import FakeApiServer
from kubefakes.apiserver.admission import service_account_user
from tests.chart.render import NAMESPACE, render
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
