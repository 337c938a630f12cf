"""The extender over HTTPS follows certificate rotation without a restart (the webhook's mechanism,
`hami.tls.ReloadingTLS`): a new connection after the files change is served the new certificate;
a half-written pair keeps the old one."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

from cryptography import x509

from tests.integration.extender_harness import start_extender, wait_ready
from webhook.devcerts import CA, make_ca, make_server_cert, write_pair


def client_ssl(*cas: CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.load_verify_locations(cadata="".join(c.cert_pem.decode() for c in cas))
    return ctx


async def served_serial(port: int, *cas: CA) -> int:
    """Serial number of the certificate a fresh, verified TLS connection is served."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ssl(*cas), server_hostname="127.0.0.1")
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return x509.load_der_x509_certificate(der).serial_number


def serial(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


async def test_the_extender_serves_a_rotated_certificate_without_restart(fake_apiserver, session, tmp_path: Path) -> None:
    ca = make_ca()
    first_cert, first_key = make_server_cert(ca)
    cert, key = write_pair(tmp_path, first_cert, first_key)
    server = await start_extender(fake_apiserver, "--tls-cert-file", str(cert), "--tls-private-key-file", str(key))
    try:
        await wait_ready(server)
        assert await served_serial(server.port, ca) == serial(first_cert)
        rotated = make_ca("rotated-ca")
        new_cert, new_key = make_server_cert(rotated)
        key.write_bytes(new_key)  # half-way through the rotation: the old pair is still served
        assert await served_serial(server.port, ca) == serial(first_cert)
        cert.write_bytes(new_cert)
        assert await served_serial(server.port, rotated) == serial(new_cert)
        async with session.get(f"{server.url}/readyz", ssl=client_ssl(rotated)) as r:
            assert r.status == 200
    finally:
        await server.stop()
