"""Fuzzed requests to the real servers, in-process: no request kills a server or gets a 500.

The extender (against the in-memory API server), the webhook (over TLS) and the device plugin (over
its gRPC socket, registered with the fake kubelet) run on one background event loop for the whole
module; hypothesis sends them bodies and requests shaped like kube-scheduler's, the API server's and
kubelet's, mostly near-valid. Every answer must be a protocol answer (HTTP 200/400/413 with a JSON
body; gRPC OK, FAILED_PRECONDITION or UNAVAILABLE), and each server must still answer a well-formed
request afterwards. Example counts are bounded so the module runs in well under a minute.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
import threading
from collections.abc import Coroutine
from typing import Any

import grpc
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device_plugin.api import api_pb2 as pb
from device_plugin.api import api_pb2_grpc as rpc
from device_plugin.app import DevicePluginApp, PluginOptions
from device_plugin.backends.fake import FakeBackend
from hami.kube import KubeClient
from kubefakes.apiserver import FakeApiServer
from kubefakes.kubelet import FakeKubelet
from tests.builders import cards, gpu_node
from tests.fuzz.test_decoders import (
    binding_args,
    extender_args,
    json_value,
    preempt_args,
    raw_body,
    review_st,
)
from tests.integration.extender_harness import start_extender, wait_ready
from webhook import cli as webhook_cli
from webhook.devcerts import make_ca, make_server_cert, write_pair

SERVER_FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Loop:
    """An event loop on a daemon thread; `run(coro)` waits for the coroutine's result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-servers", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz-servers")
    loop = Loop()
    with FakeApiServer() as api:
        api.store.create("nodes", gpu_node("gpu-0", cards("gpu-0", 2)))
        extender = loop.run(start_extender(api))
        loop.run(wait_ready(extender))

        ca = make_ca()
        cert, key = write_pair(tmp, *make_server_cert(ca))
        args = webhook_cli.parse_args(
            [
                "--tls-cert-file",
                str(cert),
                "--tls-private-key-file",
                str(key),
                "--address",
                "127.0.0.1",
                "--port",
                "0",
            ]
        )
        webhook = loop.run(webhook_cli.start(args))
        ctx = ssl.create_default_context()
        ctx.load_verify_locations(cadata=ca.cert_pem.decode())

        kubelet = FakeKubelet(tmp / "device-plugins")
        loop.run(kubelet.start())
        hook = tmp / "hook" / "vgpu"
        hook.mkdir(parents=True)
        (hook / "libvgpu.so").write_text("fake library")
        (hook / "ld.so.preload").write_text(f"{hook}/libvgpu.so\n")
        cards_file = tmp / "cards.yaml"
        cards_file.write_text(
            yaml.safe_dump(
                {"cards": [{"uuid": "GPU-aaaa", "index": 0, "model": "Tesla T4", "memory_mib": 15360}]}
            )
        )
        api.store.create("nodes", {"metadata": {"name": "dp-node"}})
        plugin = DevicePluginApp(
            PluginOptions(
                node_name="dp-node",
                socket_dir=str(kubelet.socket_dir),
                hook_path=str(tmp / "hook"),
            ),
            FakeBackend(cards_file, poll_s=0.5),
            KubeClient.from_kubeconfig(api.kubeconfig_path),
        )
        loop.run(plugin.start())
        loop.run(kubelet.wait_registered("nvidia.com/gpu"))
        channel = grpc.insecure_channel(f"unix://{plugin.socket_path}")
        try:
            yield {
                "extender": extender.port,
                "webhook": (webhook.port, ctx),
                "plugin": rpc.DevicePluginStub(channel),
            }
        finally:
            channel.close()
            loop.run(plugin.stop())
            loop.run(kubelet.stop())
            loop.run(webhook.stop())
            loop.run(extender.stop())
            loop.close()


def post(port: int, path: str, body: bytes, *, ctx: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    conn = (
        http.client.HTTPSConnection("127.0.0.1", port, timeout=20, context=ctx)
        if ctx
        else http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    )
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def json_answer(status: int, body: bytes) -> Any:
    assert status in (200, 400, 413), (status, body[:300])
    return json.loads(body)


GOOD_FILTER = json.dumps(
    {
        "Pod": {"metadata": {"uid": "ok", "name": "ok", "namespace": "default"}, "spec": {"containers": []}},
        "NodeNames": ["gpu-0"],
    }
).encode()


@SERVER_FUZZ
@given(
    body=st.one_of(
        extender_args.map(json.dumps).map(str.encode), json_value.map(json.dumps).map(str.encode), raw_body
    )
)
def test_extender_filter_and_bind_survive_fuzzed_bodies(servers, body):
    port = servers["extender"]
    reply = json_answer(*post(port, "/filter", body))
    assert isinstance(reply, dict)
    reply = json_answer(*post(port, "/bind", body))
    assert isinstance(reply, dict)


@SERVER_FUZZ
@given(body=st.one_of(preempt_args.map(json.dumps).map(str.encode), raw_body))
def test_extender_preempt_survives_fuzzed_bodies(servers, body):
    status, text = post(servers["extender"], "/preempt", body)
    # No error field in ExtenderPreemptionResult: a bad body is a 400 with a one-line text.
    assert status in (200, 400), (status, text[:300])
    if status == 200:
        assert set(json.loads(text)) == {"NodeNameToMetaVictims"}
    else:
        assert b"Traceback" not in text and text.count(b"\n") == 1


@SERVER_FUZZ
@given(body=st.one_of(binding_args.map(json.dumps).map(str.encode), raw_body))
def test_extender_bind_survives_fuzzed_binding_args(servers, body):
    reply = json_answer(*post(servers["extender"], "/bind", body))
    assert isinstance(reply, dict) and ("Error" in reply or "error" in reply)


@SERVER_FUZZ
@given(body=st.one_of(review_st.map(json.dumps).map(str.encode), raw_body))
def test_webhook_survives_fuzzed_reviews(servers, body):
    port, ctx = servers["webhook"]
    status, text = post(port, "/mutate", body, ctx=ctx)
    reply = json_answer(status, text)
    if status == 200:
        assert reply["response"].get("status", {}).get("code") != 500, reply


ids = st.sampled_from([f"GPU-aaaa-{i}" for i in range(12)]) | st.text(max_size=12)


@SERVER_FUZZ
@given(
    allocate=st.lists(st.lists(ids, max_size=4), max_size=3),
    preferred=st.lists(
        st.tuples(st.lists(ids, max_size=6), st.lists(ids, max_size=3), st.integers(-(2**31), 2**31 - 1)),
        max_size=3,
    ),
)
def test_device_plugin_survives_fuzzed_requests(servers, allocate, preferred):
    stub = servers["plugin"]
    try:
        stub.Allocate(
            pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=r) for r in allocate]
            ),
            timeout=20,
        )
    except grpc.RpcError as e:
        # No pod holds this node's lock and none runs here: a refusal, never an internal error.
        assert e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE), e.details()
    req = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=a, must_include_deviceIDs=m, allocation_size=n
            )
            for a, m, n in preferred
        ]
    )
    resp = stub.GetPreferredAllocation(req, timeout=20)  # never fails: an error would fail the pod
    assert len(resp.container_responses) == len(preferred)


def test_every_server_still_answers_after_the_fuzzing(servers):
    reply = json_answer(*post(servers["extender"], "/filter", GOOD_FILTER))
    assert reply["Error"] == "" and reply["NodeNames"] == ["gpu-0"]
    port, ctx = servers["webhook"]
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u", "operation": "CREATE", "namespace": "default",
                          "object": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}}}  # fmt: skip
    status, text = post(port, "/mutate", json.dumps(review).encode(), ctx=ctx)
    assert status == 200 and json.loads(text)["response"]["allowed"] is True
    options = servers["plugin"].GetDevicePluginOptions(pb.Empty(), timeout=10)
    assert options.get_preferred_allocation_available is True


def test_a_body_nested_200000_deep_is_a_400_not_a_dead_server(servers):
    body = b"[" * 200_000 + b"]" * 200_000
    assert post(servers["extender"], "/filter", body)[0] in (200, 400)
    port, ctx = servers["webhook"]
    assert post(port, "/mutate", body, ctx=ctx)[0] == 400
    assert json_answer(*post(servers["extender"], "/filter", GOOD_FILTER))["NodeNames"] == ["gpu-0"]
