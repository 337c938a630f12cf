"""hami.kube.retry: the one retry policy (waits, attempt counts, what is retried) and its users that have
no API server of their own to test against (the device plugin's node registration loop)."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from device_plugin.api import api_pb2 as pb
from device_plugin.api import api_pb2_grpc as rpc
from device_plugin.devices import Card, DeviceState
from device_plugin.kubelet import KubeletRegistration
from device_plugin.node_register import NodeRegistrar
from hami import annotations as ann
from hami.errors import ApiError, Conflict
from hami.kube.retry import Backoff, retry_call, retry_call_async
from hami.nodelock import RETRY_BACKOFF, RETRY_STEPS
from kubefakes.kubelet import FakeKubelet


@pytest.mark.parametrize(
    ("backoff", "waits"),
    [
        pytest.param(Backoff(0.1), [0.1, 0.2, 0.4, 0.8], id="exponential"),
        pytest.param(Backoff(0.25, max_s=2.0), [0.25, 0.5, 1.0, 2.0, 2.0], id="capped"),
        pytest.param(Backoff(5.0, factor=1.0), [5.0, 5.0, 5.0], id="constant"),
        pytest.param(Backoff(0.1, immediate_first=True), [0.0, 0.1, 0.2, 0.4], id="first-at-once"),
    ],
)
def test_backoff_without_jitter_is_exact(backoff: Backoff, waits: list[float]) -> None:
    assert [backoff.delay(n) for n in range(1, len(waits) + 1)] == pytest.approx(waits)


def test_jitter_stretches_up_to_its_fraction_and_the_cap_holds() -> None:
    b = Backoff(0.1, max_s=0.3, jitter=0.5)
    for _ in range(200):
        assert 0.1 <= b.delay(1) <= 0.15
        assert 0.2 <= b.delay(2) <= 0.3
        assert b.delay(6) == 0.3  # capped after the jitter too
    assert Backoff(0.1, max_s=2.0).delay(1, at_least_s=1.5) == 1.5  # Retry-After wins ...
    assert Backoff(0.1, max_s=2.0).delay(1, at_least_s=30) == 2.0  # ... up to the cap


def test_node_lock_backoff_is_hamis() -> None:
    # One conflict is retried at once, then 100 ms doubling with up to +50 % jitter, five retries.
    assert RETRY_STEPS == 5
    assert RETRY_BACKOFF.delay(1) == 0.0
    for n, base in ((2, 0.1), (3, 0.2), (4, 0.4), (5, 0.8)):
        assert base <= RETRY_BACKOFF.delay(n) <= base * 1.5


def test_retry_call_retries_only_what_it_is_told_and_re_raises_the_last() -> None:
    calls: list[int] = []
    sleeps: list[float] = []
    seen: list[tuple[int, str]] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise Conflict(f"try {len(calls)}")
        return "done"

    out = retry_call(
        flaky, retry_on=(Conflict,), retries=5, backoff=Backoff(0.1), sleep=sleeps.append,
        on_retry=lambda n, e: seen.append((n, str(e))),
    )  # fmt: skip
    assert out == "done" and len(calls) == 3
    assert sleeps == pytest.approx([0.1, 0.2])
    assert seen == [(1, "try 1"), (2, "try 2")]

    calls.clear()
    sleeps.clear()

    def always() -> None:
        calls.append(1)
        raise Conflict(f"try {len(calls)}")

    with pytest.raises(Conflict, match="try 4"):
        retry_call(always, retry_on=(Conflict,), retries=3, backoff=Backoff(0.1), sleep=sleeps.append)
    assert len(calls) == 4 and len(sleeps) == 3  # no wait after the last try

    calls.clear()

    def answer() -> None:
        calls.append(1)
        raise ApiError("forbidden", status=403)

    with pytest.raises(ApiError, match="forbidden"):
        retry_call(answer, retry_on=(Conflict,), retries=3, backoff=Backoff(0.1), sleep=sleeps.append)
    assert len(calls) == 1


async def test_retry_call_async_until_success_with_the_callers_sleep() -> None:
    calls: list[int] = []
    sleeps: list[float] = []

    async def flaky() -> int:
        calls.append(1)
        if len(calls) < 4:
            raise OSError("kubelet not there yet")
        return len(calls)

    async def sleep(s: float) -> None:
        sleeps.append(s)

    assert (
        await retry_call_async(flaky, retry_on=(OSError,), backoff=Backoff(0.25, max_s=0.5), sleep=sleep) == 4
    )
    assert sleeps == [0.25, 0.5, 0.5]

    async def never() -> None:
        raise OSError("gone")

    with pytest.raises(OSError, match="gone"):
        await retry_call_async(never, retry_on=(OSError,), backoff=Backoff(0.0), retries=2, sleep=sleep)


class FlakyNodes:
    """get_node/patch_node_annotations of one node; the first `failures` GETs raise ApiError 500."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.node = {"metadata": {"name": "n1", "annotations": {}}}
        self.gets = 0

    def get_node(self, name: str) -> dict:
        self.gets += 1
        if self.gets <= self.failures:
            raise ApiError("get nodes n1: Internal error occurred", status=500)
        return self.node

    def patch_node_annotations(
        self, name: str, annotations: dict, *, resource_version: str | None = None
    ) -> dict:
        self.node["metadata"]["annotations"].update(annotations)
        return self.node


async def test_node_registration_retries_every_retry_s_after_api_errors() -> None:
    kube = FlakyNodes(failures=2)
    state = DeviceState([Card(uuid="GPU-a", index=0, model="NVIDIA-Tesla V100-PCIE-32GB", memory_mib=32768)],
                        split_count=10)  # fmt: skip
    errors: list[int] = []
    patched = asyncio.Event()
    reg = NodeRegistrar(
        kube, "n1", state, interval_s=3600.0, retry_s=0.01,
        on_error=lambda: errors.append(1), on_patch=patched.set,
    )  # fmt: skip
    task = asyncio.create_task(reg.run())
    try:
        await asyncio.wait_for(patched.wait(), 10)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert errors == [1, 1] and kube.gets == 3
    annos = kube.node["metadata"]["annotations"]
    assert annos[ann.NVIDIA_REGISTER] == reg.encode()
    assert ann.decode_handshake(annos[ann.NVIDIA_HANDSHAKE]).state == ann.HANDSHAKE_REPORTED


class BusyKubelet(FakeKubelet):
    """A kubelet that refuses the first `refusals` Register calls (UNAVAILABLE), then accepts."""

    def __init__(self, socket_dir, refusals: int) -> None:  # type: ignore[no-untyped-def]
        super().__init__(socket_dir, sync_options=False)
        self.refusals = refusals

    async def Register(self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext) -> pb.Empty:  # noqa: N802
        if self.refusals > 0:
            self.refusals -= 1
            self.register_requests.append(request)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet busy")
        return await super().Register(request, context)


async def test_kubelet_registration_is_retried_until_kubelet_accepts(tmp_path, caplog) -> None:
    kubelet = BusyKubelet(tmp_path, refusals=2)
    await kubelet.start()
    reg = KubeletRegistration(rpc.DevicePluginServicer, socket_dir=tmp_path, resource_name="nvidia.com/gpu",
                              poll_s=0.02)  # fmt: skip
    caplog.set_level(logging.WARNING, logger="device_plugin.kubelet")
    try:
        await reg.start()
        await kubelet.wait_for(lambda: reg.registered, timeout=10)
    finally:
        await reg.stop()
        await kubelet.stop()
    assert reg.registrations == 1 and len(kubelet.register_requests) == 3
    failures = [r.getMessage() for r in caplog.records if "with kubelet failed" in r.getMessage()]
    assert failures == ["registering nvidia.com/gpu with kubelet failed: kubelet busy; retrying"] * 2
