"""The webhook served over TLS, as the API server calls it.

A throwaway CA signs the serving certificate; the client verifies the chain and the 127.0.0.1 SAN, as
the API server does against `caBundle`. Covers: golden reviews in both versions through HTTPS, the
/webhook alias, /healthz and /metrics, bodies that are not reviews (400, the server stays up), and
certificate rotation while requests are in flight (new connections get the new certificate, no
request fails, a half-written pair is not picked up).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import jsonpatch
import pytest
from cryptography import x509

from webhook import cli
from webhook.devcerts import CA, make_ca, make_server_cert, write_pair

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "webhook"


@dataclass
class Server:
    url: str
    running: cli.Running
    ca: CA
    cert_dir: Path

    def client_ssl(self, *cas: CA) -> ssl.SSLContext:
        ctx = ssl.create_default_context()
        ctx.load_verify_locations(cadata="".join(c.cert_pem.decode() for c in (cas or (self.ca,))))
        return ctx


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    ca = make_ca()
    cert, key = write_pair(tmp_path, *make_server_cert(ca))
    args = cli.parse_args(
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
    running = await cli.start(args)
    try:
        yield Server(f"https://127.0.0.1:{running.port}", running, ca, tmp_path)
    finally:
        await running.stop()


def golden_request(case: str, version: str = "admission.k8s.io/v1") -> tuple[dict, dict]:
    golden = json.loads((GOLDEN / f"{case}.json").read_text())
    request, response = golden["request"], golden["response"]
    request["apiVersion"] = response["apiVersion"] = version
    return request, response


async def post(server: Server, path: str, body: bytes | str, *, ssl_ctx: ssl.SSLContext | None = None):
    async with aiohttp.ClientSession() as session:
        async with session.post(
            server.url + path,
            data=body,
            headers={"Content-Type": "application/json"},
            ssl=ssl_ctx or server.client_ssl(),
        ) as resp:
            return resp.status, resp.headers.get("Content-Type"), await resp.text()


@pytest.mark.parametrize("version", ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
@pytest.mark.parametrize("path", ["/mutate?timeout=10s", "/webhook"])
async def test_golden_review_over_verified_tls(server: Server, version: str, path: str) -> None:
    request, expected = golden_request("priority-env-append", version)
    status, ctype, text = await post(server, path, json.dumps(request))
    assert (status, ctype) == (200, "application/json")
    reply = json.loads(text)
    assert reply == expected
    ops = json.loads(base64.b64decode(reply["response"]["patch"]))
    pod = jsonpatch.apply_patch(request["request"]["object"], ops)
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    assert pod["spec"]["containers"][0]["env"] == [
        {"name": "NCCL_DEBUG", "value": "WARN"},
        {"name": "CUDA_TASK_PRIORITY", "value": "1"},
    ]


async def test_client_trusting_another_ca_is_refused(server: Server) -> None:
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await post(server, "/mutate", "{}", ssl_ctx=server.client_ssl(make_ca("stranger")))


async def test_healthz_and_metrics(server: Server) -> None:
    for case in ("bare-gpu-exclusive", "no-device-pod", "deny-privileged"):
        request, _ = golden_request(case)
        assert (await post(server, "/mutate", json.dumps(request)))[0] == 200
    assert (await post(server, "/mutate", b"not json"))[0] == 400
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + "/healthz", ssl=server.client_ssl()) as resp:
            assert (resp.status, await resp.text()) == (200, "ok")
        async with session.get(server.url + "/metrics", ssl=server.client_ssl()) as resp:
            text = await resp.text()
    assert 'hami_webhook_reviews_total{result="patched"} 1.0' in text
    assert 'hami_webhook_reviews_total{result="allowed"} 1.0' in text
    assert 'hami_webhook_reviews_total{result="denied"} 1.0' in text
    assert 'hami_webhook_reviews_total{result="error"} 1.0' in text
    assert "hami_webhook_review_duration_seconds_count 4.0" in text


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"", "body is not JSON"),
        (b"{{{", "body is not JSON"),
        (b'"AdmissionReview"', "body must be a JSON object (an AdmissionReview), got str"),
        (json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {}}), "kind must be AdmissionReview, got 'Pod'"),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v2", "kind": "AdmissionReview", "request": {"uid": "x"}}),
            "apiVersion 'admission.k8s.io/v2' is not supported; valid: admission.k8s.io/v1, admission.k8s.io/v1beta1",
        ),
        (json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}),
         "request.uid is missing or empty"),
        # QA regression: nesting past the recursion limit was an aiohttp 500 "Server got itself in trouble".
        (b"[" * 100_000, "body is not a usable AdmissionReview: JSON nested too deeply"),
        ('{"a":' * 5000 + "1" + "}" * 5000, "body is not a usable AdmissionReview: JSON nested too deeply"),
    ],
)  # fmt: skip
async def test_bad_bodies_get_400_and_server_stays_up(server: Server, body: bytes | str, error: str) -> None:
    status, ctype, text = await post(server, "/mutate", body)
    assert (status, ctype) == (400, "application/json")
    assert json.loads(text)["error"].startswith(error)
    request, expected = golden_request("bare-gpu-exclusive")
    status, _, text = await post(server, "/mutate", json.dumps(request))
    assert status == 200 and json.loads(text) == expected


async def test_oversized_body_and_wrong_method(server: Server) -> None:
    status, _, text = await post(server, "/mutate", b"x" * (5 * 1024 * 1024))
    assert status == 413
    async with aiohttp.ClientSession() as session:
        async with session.get(server.url + "/mutate", ssl=server.client_ssl()) as resp:
            assert resp.status == 405
    request, _ = golden_request("no-device-pod")
    assert (await post(server, "/mutate", json.dumps(request)))[0] == 200


async def test_unreadable_body_encoding_is_a_400_not_a_500(server: Server) -> None:
    # QA regression: a Content-Encoding the body does not match made aiohttp answer 500 with its own text.
    async with aiohttp.ClientSession() as session:
        async with session.post(
            server.url + "/mutate",
            data=b"not gzip at all",
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
            ssl=server.client_ssl(),
        ) as resp:
            assert (resp.status, resp.headers.get("Content-Type")) == (400, "application/json")
            error = (await resp.json())["error"]
    assert error.startswith("body could not be read: ") and "gzip" in error
    request, expected = golden_request("bare-gpu-exclusive")
    status, _, text = await post(server, "/mutate", json.dumps(request))
    assert status == 200 and json.loads(text) == expected


async def peer_serial(server: Server, *cas: CA) -> int:
    """Serial number of the certificate a fresh TLS connection is served (chain verified)."""
    _, writer = await asyncio.open_connection(
        "127.0.0.1", server.running.port, ssl=server.client_ssl(*cas), server_hostname="127.0.0.1"
    )
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


def _serial(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


async def test_certificate_rotation_during_traffic(server: Server) -> None:
    old_serial = await peer_serial(server)
    new_ca = make_ca("rotated-ca")
    new_cert, new_key = make_server_cert(new_ca)
    request, expected = golden_request("bare-gpu-exclusive")
    body = json.dumps(request)
    both = server.client_ssl(server.ca, new_ca)
    failures: list[Exception] = []
    answered = 0
    stop = asyncio.Event()

    async def traffic() -> None:
        nonlocal answered
        # A fresh connection per request, as after each rotation the API server re-dials.
        connector = aiohttp.TCPConnector(force_close=True, ssl=both)
        async with aiohttp.ClientSession(connector=connector) as session:
            while not stop.is_set():
                try:
                    async with session.post(server.url + "/mutate", data=body) as resp:
                        assert resp.status == 200 and await resp.json() == expected
                        answered += 1
                except Exception as exc:  # every failure, assertion or transport, fails the test
                    failures.append(exc)

    tasks = [asyncio.create_task(traffic()) for _ in range(4)]
    await asyncio.sleep(0.2)
    # A certgen job writing the key first: the pair does not match yet and must not be picked up.
    key_path, cert_path = server.cert_dir / "tls.key", server.cert_dir / "tls.crt"
    key_path.write_bytes(new_key)
    await asyncio.sleep(0.1)
    assert await peer_serial(server) == old_serial
    cert_path.write_bytes(new_cert)
    await asyncio.sleep(0.2)
    stop.set()
    await asyncio.gather(*tasks)
    assert failures == []
    assert answered > 10
    # New connections get the new certificate; a client trusting only the new CA now succeeds.
    assert await peer_serial(server, new_ca) == _serial(new_cert)
    assert server.running.tls.stats.reloads == 1
    assert server.running.tls.stats.failures == 1


async def test_rotation_by_secret_volume_symlink_swap(tmp_path: Path) -> None:
    # kubelet updates Secret volumes by re-pointing the ..data symlink: same path, new inode.
    ca = make_ca()
    v1 = tmp_path / "..2026_01"
    write_pair(v1, *make_server_cert(ca))
    (tmp_path / "..data").symlink_to(v1.name)
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).symlink_to(f"..data/{name}")
    args = cli.parse_args(["--tls-cert-file", str(tmp_path / "tls.crt"), "--tls-private-key-file",
                           str(tmp_path / "tls.key"), "--address", "127.0.0.1", "--port", "0"])  # fmt: skip
    running = await cli.start(args)
    server = Server(f"https://127.0.0.1:{running.port}", running, ca, tmp_path)
    try:
        first = await peer_serial(server)
        new_cert, new_key = make_server_cert(ca)
        write_pair(tmp_path / "..2026_02", new_cert, new_key)
        os.symlink("..2026_02", tmp_path / "..data_tmp")
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
        second = await peer_serial(server)
        assert first != second == _serial(new_cert)
        async with aiohttp.ClientSession() as session:
            async with session.get(server.url + "/metrics", ssl=server.client_ssl()) as resp:
                assert 'hami_webhook_cert_reloads_total{result="ok"} 1.0' in await resp.text()
    finally:
        await running.stop()


def test_cli_refuses_missing_certificate(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rc = cli.main(["--tls-cert-file", str(tmp_path / "nope.crt"), "--tls-private-key-file", str(tmp_path / "k"),
                   "--port", "0"])  # fmt: skip
    assert rc == 2
    assert "cannot start" in caplog.text


def test_cli_refuses_bad_config(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cert, key = write_pair(tmp_path, *make_server_cert(make_ca()))
    config = tmp_path / "device-config.yaml"
    config.write_text("nvidia:\n  defaultGPUNum: -1\n")
    rc = cli.main(["--tls-cert-file", str(cert), "--tls-private-key-file", str(key), "--port", "0",
                   "--config", str(config)])  # fmt: skip
    assert rc == 2
    assert "nvidia.defaultGPUNum: -1 is invalid" in caplog.text
