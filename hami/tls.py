"""TLS for the servers (admission webhook, scheduler extender) with certificate rotation and no restart.

The API server only talks HTTPS to webhooks, kube-scheduler talks HTTPS to an extender with
``enableHTTPS``, and the serving certificate is short-lived: cert-manager or a certgen job rewrites
the Secret, and the kubelet swaps the mounted files (an atomic symlink swap for Secret volumes, or two
plain writes for hostPath setups). A server that reads its certificate once keeps serving the old one
until it expires, then every pod creation in scope (webhook) or every scheduling attempt (extender)
fails.

How: the server's `SSLContext` carries an SNI callback, which OpenSSL calls during every handshake
(also when the client sends no server name, e.g. a URL with an IP address). The callback stats the two
files (device, inode, size, mtime: a few microseconds) and, when they changed, builds a fresh context
from them and hands it to this connection; later connections get it too. A pair that does not load
(key written but not yet the certificate) keeps the previous context and is retried on the next
handshake, so a half-written rotation never takes the server down. Established connections keep the
certificate they negotiated, as TLS requires.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

Signature = tuple[tuple[int, int, int, int], tuple[int, int, int, int]]


def _stat(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)  # follows the ..data symlink of a Secret volume, so a swap changes the inode
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class ReloadStats:
    """Counters for /metrics: successful reloads and failed attempts (kept pair = previous one)."""

    reloads: int = 0
    failures: int = 0


class ReloadingTLS:
    """A server `SSLContext` whose certificate follows the files on disk.

    `cert_file`/`key_file` are PEM paths. The constructor loads them and raises `ssl.SSLError` /
    `OSError` when the initial pair is unusable (startup must fail loudly). `client_ca_file` (PEM):
    clients must present a certificate signed by one of its CAs (read again with every reload). `on_reload(ok: bool)` is
    called after every reload attempt (for metrics). Use `.context` as aiohttp's `ssl_context`.
    """

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        *,
        on_reload: Callable[[bool], None] | None = None,
        client_ca_file: str | None = None,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        # With a client CA every handshake must present a client certificate signed by it (mutual TLS).
        self.client_ca_file = client_ca_file
        self._on_reload = on_reload
        self.stats = ReloadStats()
        self._signature = self._current_signature()
        self._failed_signature: Signature | None = None
        self._active = self._build()
        # The listening context also holds the pair so that a handshake is served even if a future
        # OpenSSL skipped the callback; the callback then switches to the freshest context.
        self.context = self._build()
        self.context.sni_callback = self._on_handshake

    def _current_signature(self) -> Signature:
        return (_stat(self.cert_file), _stat(self.key_file))

    def _build(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.client_ca_file:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(cafile=self.client_ca_file)
        return ctx

    def check(self) -> bool:
        """Reload when the files changed; returns True when a new pair is now active.

        Never raises: a missing or mismatched pair is logged, counted, and retried once either file
        changes again.
        """
        try:
            signature = self._current_signature()
        except OSError as exc:
            log.warning("TLS files unreadable, keeping the current certificate: %s", exc)
            return False
        if signature == self._signature or signature == self._failed_signature:
            return False
        try:
            fresh = self._build()
        except (ssl.SSLError, OSError) as exc:
            # Remember the broken pair so that every handshake does not retry it; the next write to
            # either file changes the signature and triggers a new attempt.
            self._failed_signature = signature
            self.stats.failures += 1
            log.warning("TLS certificate %s changed but does not load yet: %s", self.cert_file, exc)
            if self._on_reload:
                self._on_reload(False)
            return False
        self._active = fresh
        self._signature = signature
        self.stats.reloads += 1
        log.info("TLS certificate %s reloaded", self.cert_file)
        if self._on_reload:
            self._on_reload(True)
        return True

    def _on_handshake(self, sock: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _ctx) -> None:
        self.check()
        if sock.context is not self._active:
            sock.context = self._active
