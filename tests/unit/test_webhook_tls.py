"""ReloadingTLS.check(): reload on change, keep the old pair while the new one does not load, and do
not retry a broken pair until a file changes again."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from webhook.devcerts import make_ca, make_server_cert, write_pair
from webhook.tls import ReloadingTLS


def test_reload_cycle(tmp_path: Path) -> None:
    ca = make_ca()
    cert, key = write_pair(tmp_path, *make_server_cert(ca))
    events: list[bool] = []
    tls = ReloadingTLS(str(cert), str(key), on_reload=events.append)
    assert tls.check() is False  # nothing changed

    new_cert, new_key = make_server_cert(ca)
    key.write_bytes(new_key)  # half-way through a rotation: the key no longer matches the certificate
    assert tls.check() is False
    assert tls.check() is False  # the same broken pair is not retried on every handshake
    assert (tls.stats.reloads, tls.stats.failures, events) == (0, 1, [False])

    cert.write_bytes(new_cert)
    assert tls.check() is True
    assert (tls.stats.reloads, tls.stats.failures, events) == (1, 1, [False, True])
    assert tls.check() is False


def test_missing_files_keep_serving(tmp_path: Path) -> None:
    cert, key = write_pair(tmp_path, *make_server_cert(make_ca()))
    tls = ReloadingTLS(str(cert), str(key))
    cert.unlink()
    assert tls.check() is False
    assert tls.stats.failures == 0


def test_unusable_initial_pair_fails_loudly(tmp_path: Path) -> None:
    ca = make_ca()
    cert_pem, _ = make_server_cert(ca)
    _, other_key = make_server_cert(ca)
    cert, key = write_pair(tmp_path, cert_pem, other_key)
    with pytest.raises(ssl.SSLError):
        ReloadingTLS(str(cert), str(key))
