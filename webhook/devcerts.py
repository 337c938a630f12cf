"""Throwaway CA and serving certificates for tests, the benchmark and local runs.

In a cluster the serving certificate comes from cert-manager or the chart's certgen job; locally and in
CI we need the same shape (a CA that signs a server certificate with the Service DNS names and
127.0.0.1 as SANs, since the API server rejects CN-only certificates) without any tool. Requires the
`cryptography` package (test extras), imported here only.

    python -m webhook.devcerts --out DIR [--dns hami-webhook.kube-system.svc]
writes DIR/ca.crt, DIR/tls.crt, DIR/tls.key.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CA:
    """A self-signed CA: its certificate PEM and private key object (to sign server certificates)."""

    cert_pem: bytes
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def make_ca(common_name: str = "hami-webhook-test-ca", *, validity: dt.timedelta = dt.timedelta(days=1)) -> CA:
    """A new P-256 CA valid for `validity` (default one day, enough for any test run), from 5 minutes ago
    (clock skew between nodes)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .sign(key, hashes.SHA256())
    )
    return CA(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key=key, cert=cert)


def make_client_cert(
    ca: CA, common_name: str = "system:kube-scheduler", *, validity: dt.timedelta = dt.timedelta(days=1)
) -> tuple[bytes, bytes]:
    """A client certificate (extended key usage clientAuth) for `common_name` signed by `ca`, valid for
    `validity` from 5 minutes ago: (certificate PEM, PKCS#8 key PEM)."""
    return make_server_cert(ca, dns_names=(common_name,), ips=(), validity=validity, usage="client")


def make_server_cert(
    ca: CA,
    *,
    dns_names: tuple[str, ...] = ("localhost",),
    ips: tuple[str, ...] = ("127.0.0.1",),
    validity: dt.timedelta = dt.timedelta(days=1),
    usage: str = "server",
) -> tuple[bytes, bytes]:
    """A serving certificate signed by `ca` with the SANs given, valid for `validity` (default one day)
    from 5 minutes ago: (certificate PEM, PKCS#8 key PEM). `usage` "client" makes a client certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0] if dns_names else ips[0])])
        )
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - dt.timedelta(minutes=5))
        .not_valid_after(_now() + validity)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH if usage == "client" else ExtendedKeyUsageOID.SERVER_AUTH]
            ),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def write_pair(directory: Path, cert_pem: bytes, key_pem: bytes) -> tuple[Path, Path]:
    """Write tls.crt and tls.key into `directory` (key mode 0600); returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert_pem)
    key_path.write_bytes(key_pem)
    key_path.chmod(0o600)
    return cert_path, key_path


def main(argv: list[str] | None = None) -> int:
    """`python -m webhook.devcerts --out DIR`: a CA and a serving pair for local runs."""
    parser = argparse.ArgumentParser(prog="python -m webhook.devcerts", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="directory for ca.crt, tls.crt, tls.key")
    parser.add_argument("--dns", action="append", default=[], help="DNS SAN (repeatable); default localhost")
    args = parser.parse_args(argv)
    ca = make_ca()
    cert_pem, key_pem = make_server_cert(ca, dns_names=tuple(args.dns) or ("localhost",))
    write_pair(args.out, cert_pem, key_pem)
    (args.out / "ca.crt").write_bytes(ca.cert_pem)
    print(f"wrote {args.out}/ca.crt, tls.crt, tls.key")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
