"""Who can reach the extender's verbs: /filter, /prioritize and /bind decide placements, so a cluster
user who can reach a Service must not be able to call them.

The verbs listen on 127.0.0.1 by default (kube-scheduler runs beside the extender in one pod); health
and metrics have a listener of their own for probes and Prometheus; a remote verbs listener needs TLS
with client certificates.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp
import pytest

from scheduler_extender.cli import parse_args
from tests.builders import cards, gpu_node
from tests.integration.extender_harness import start_extender, wait_ready
from webhook.devcerts import make_ca, make_client_cert, make_server_cert, write_pair


def test_the_verbs_listen_on_loopback_by_default() -> None:
    options = parse_args([], env={})
    assert options.address == "127.0.0.1"


@pytest.mark.parametrize("address", ["0.0.0.0", "10.1.2.3", "::"])
def test_a_remote_verbs_listener_without_client_certificates_is_refused(address, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--address", address], env={})
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"--address {address}" in err and "--client-ca-file" in err


async def test_the_metrics_listener_serves_health_and_metrics_but_no_verb(fake_apiserver, session) -> None:
    fake_apiserver.store.create("nodes", gpu_node("n1", cards("a", 1)))
    server = await start_extender(fake_apiserver, "--metrics-bind-address", "127.0.0.1:0")
    try:
        await wait_ready(server)
        assert server.metrics_url is not None and server.metrics_url != server.url
        for path in ("/healthz", "/readyz", "/metrics"):
            async with session.get(server.metrics_url + path) as r:
                assert r.status == 200, path
        for verb in ("/filter", "/prioritize", "/bind"):
            async with session.post(server.metrics_url + verb, data=b"{}") as r:
                assert r.status in (404, 405), verb
            async with session.post(server.url + verb, data=b"{}") as r:
                assert r.status == 200, verb  # the verbs listener answers (an Error for an empty body)
    finally:
        await server.stop()


async def test_a_remote_verbs_listener_needs_a_client_certificate(fake_apiserver, tmp_path: Path) -> None:
    ca, client_ca, rogue_ca = make_ca(), make_ca("scheduler-clients"), make_ca("someone-else")
    cert, key = write_pair(tmp_path, *make_server_cert(ca))
    (tmp_path / "clients.pem").write_bytes(client_ca.cert_pem)
    good = write_pair(tmp_path / "good", *make_client_cert(client_ca))
    bad = write_pair(tmp_path / "bad", *make_client_cert(rogue_ca))
    server = await start_extender(
        fake_apiserver,
        "--tls-cert-file", str(cert), "--tls-private-key-file", str(key),
        "--client-ca-file", str(tmp_path / "clients.pem"),
    )  # fmt: skip
    try:
        await wait_ready(server)

        async def status(pair: tuple[Path, Path] | None) -> int | str:
            ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
            if pair is not None:
                ctx.load_cert_chain(*pair)
            try:
                async with aiohttp.ClientSession() as s:
                    async with s.post(f"{server.url}/filter", data=b"{}", ssl=ctx) as r:
                        return r.status
            except (TimeoutError, aiohttp.ClientError, ssl.SSLError, ConnectionError) as e:
                return type(e).__name__

        assert await status(good) == 200
        assert await status(None) != 200
        assert await status(bad) != 200
    finally:
        await server.stop()
