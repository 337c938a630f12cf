#!/usr/bin/env python3
"""`hami-certgen`: the webhook's serving certificate for clusters without cert-manager.

The chart runs it as two Helm hook Jobs with the project's own image (no third-party image to mirror):

    hami-certgen create --namespace hami-system --secret-name hami-webhook-tls \
        --hosts hami-webhook,hami-webhook.hami-system.svc [--validity-days 3650]
    hami-certgen patch --namespace hami-system --secret-name hami-webhook-tls --webhook-name hami-webhook

`create` (pre-install, pre-upgrade) makes a CA and a serving certificate for `--hosts` and stores them in
a `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`, `ca.crt`) **only when the Secret does not exist**:
an upgrade keeps the CA, so the static manifests and `helm template` stay reproducible and running API
servers never see the CA change (generating it at render time, Helm's `genCA`, would rotate it on every
upgrade). `patch` (post-install, post-upgrade) copies `ca.crt` into the `caBundle` of every webhook of the
MutatingWebhookConfiguration, waiting up to `--wait` seconds for it to exist (the static manifests apply
both Jobs at once). Delete the Secret and run `helm upgrade` to rotate.

It talks to the API server itself (Secrets and webhook configurations are nothing the servers touch, so
this stays out of `hami.kube`), with the in-cluster service account; RBAC: create/get on that Secret,
get/patch on that MutatingWebhookConfiguration. Exit status 0 on success, 1 with one line on stderr.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import ipaddress
import sys
import time
from collections.abc import Sequence
from typing import Any, Protocol

SECRET_TYPE = "kubernetes.io/tls"


class Api(Protocol):
    """The four API calls certgen makes (a fake in tests, `KubernetesApi` in a cluster)."""

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def create_secret(self, namespace: str, body: dict[str, Any]) -> bool: ...
    def read_webhook(self, name: str) -> dict[str, Any] | None: ...
    def patch_webhook(self, name: str, patch: list[dict[str, Any]]) -> None: ...


def make_certificates(hosts: Sequence[str], *, validity_days: int) -> tuple[bytes, bytes, bytes]:
    """A new P-256 CA and a serving certificate it signs for `hosts` (DNS names or IPs, SANs), both valid
    for `validity_days` days from 5 minutes ago (clock skew between nodes); built by the project's own
    `webhook.devcerts`, which this image installs.

    Returns ``(ca_pem, cert_pem, key_pem)``. Raises ValueError for no hosts or a non-positive validity.
    """
    from webhook.devcerts import make_ca, make_server_cert

    if not hosts:
        raise ValueError("--hosts: want at least one DNS name")
    if validity_days < 1:
        raise ValueError(f"--validity-days {validity_days}: want 1 or more")
    validity = dt.timedelta(days=validity_days)
    dns: list[str] = []
    ips: list[str] = []
    for h in hosts:
        try:
            ipaddress.ip_address(h)
            ips.append(h)
        except ValueError:
            dns.append(h)
    ca = make_ca("hami-webhook-ca", validity=validity)
    cert_pem, key_pem = make_server_cert(ca, dns_names=tuple(dns), ips=tuple(ips), validity=validity)
    return ca.cert_pem, cert_pem, key_pem


def create(api: Api, *, namespace: str, secret_name: str, hosts: Sequence[str], validity_days: int) -> str:
    """Create the TLS Secret unless it exists. Returns "created" or "kept"."""
    if api.read_secret(namespace, secret_name) is not None:
        return "kept"
    ca_pem, cert_pem, key_pem = make_certificates(hosts, validity_days=validity_days)
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": secret_name, "namespace": namespace},
        "type": SECRET_TYPE,
        "data": {
            "tls.crt": base64.b64encode(cert_pem).decode(),
            "tls.key": base64.b64encode(key_pem).decode(),
            "ca.crt": base64.b64encode(ca_pem).decode(),
        },
    }
    # False: another Job run created it between our read and our create; theirs is as good as ours.
    return "created" if api.create_secret(namespace, body) else "kept"


def patch(
    api: Api, *, namespace: str, secret_name: str, webhook_name: str, wait_s: float = 120.0,
    sleep: Any = time.sleep,
) -> int:  # fmt: skip
    """Set every webhook's ``clientConfig.caBundle`` to the Secret's ``ca.crt``; returns how many.

    Raises LookupError when the Secret has no ``ca.crt`` or the configuration is still absent after
    `wait_s` seconds.
    """
    secret = api.read_secret(namespace, secret_name)
    ca = ((secret or {}).get("data") or {}).get("ca.crt")
    if not ca:
        raise LookupError(f"secret {namespace}/{secret_name}: no ca.crt (run 'hami-certgen create' first)")
    deadline = time.monotonic() + wait_s
    while (config := api.read_webhook(webhook_name)) is None:
        if time.monotonic() >= deadline:
            raise LookupError(f"mutatingwebhookconfiguration {webhook_name}: not found after {wait_s:g}s")
        sleep(2.0)
    hooks = config.get("webhooks") or []
    ops = [
        {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": ca} for i in range(len(hooks))
    ]
    if ops:
        api.patch_webhook(webhook_name, ops)
    return len(ops)


class KubernetesApi:
    """`Api` over the official client with the in-cluster service account (or $KUBECONFIG)."""

    def __init__(self) -> None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        self._core = client.CoreV1Api()
        self._admission = client.AdmissionregistrationV1Api()
        self._api_exception = client.exceptions.ApiException

    def _absent(self, call: Any, *args: Any) -> dict[str, Any] | None:
        try:
            return call(*args).to_dict()
        except self._api_exception as e:
            if e.status == 404:
                return None
            raise

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._absent(self._core.read_namespaced_secret, name, namespace)

    def create_secret(self, namespace: str, body: dict[str, Any]) -> bool:
        try:
            self._core.create_namespaced_secret(namespace, body)
        except self._api_exception as e:
            if e.status == 409:
                return False
            raise
        return True

    def read_webhook(self, name: str) -> dict[str, Any] | None:
        return self._absent(self._admission.read_mutating_webhook_configuration, name)

    def patch_webhook(self, name: str, patch: list[dict[str, Any]]) -> None:
        # A list body is sent as application/json-patch+json by the client.
        self._admission.patch_mutating_webhook_configuration(name, patch)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hami-certgen", description="The webhook's serving certificate")
    sub = p.add_subparsers(dest="step", required=True)
    for name, text in (("create", "create the TLS Secret once"), ("patch", "copy its CA into the webhook")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--namespace", required=True)
        s.add_argument("--secret-name", required=True)
        if name == "create":
            s.add_argument("--hosts", required=True, help="comma list of DNS names / IPs for the SANs")
            s.add_argument("--validity-days", type=int, default=3650)
        else:
            s.add_argument("--webhook-name", required=True)
            s.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the configuration")
    return p


def main(argv: Sequence[str] | None = None, api: Api | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        api = api or KubernetesApi()
        if args.step == "create":
            hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
            what = create(api, namespace=args.namespace, secret_name=args.secret_name, hosts=hosts,
                          validity_days=args.validity_days)  # fmt: skip
            print(f"secret {args.namespace}/{args.secret_name}: {what}")
        else:
            n = patch(api, namespace=args.namespace, secret_name=args.secret_name,
                      webhook_name=args.webhook_name, wait_s=args.wait)  # fmt: skip
            print(f"mutatingwebhookconfiguration {args.webhook_name}: caBundle set on {n} webhook(s)")
    except Exception as e:  # noqa: BLE001 - one line for the Job's log, never a traceback
        print(f"hami-certgen {args.step}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
