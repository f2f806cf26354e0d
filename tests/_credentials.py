"""Credentials for the security tests: bearer tokens and token files, and a throw-away PKI (a CA, a server
certificate for 127.0.0.1 and localhost, a client certificate). The `pki` fixture in `conftest.py` makes one."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

ALICE = "alice-token-0123456789abcdef"  # may write team-a/ and shared/eval
ROOT_TOKEN = "root-token-0123456789abcdef"  # may write everything
BOB = "bob-token-0123456789abcdefgh"  # may write team-ab/ (a prefix of team-a's name, not of its runs)
TOKEN = "redirect-test-token-0123456789"  # the redirect tests' daemons take this one


def token_file(path: Path, *lines: str) -> Path:
    path.write_text("# token prefixes\n" + "\n".join(lines) + "\n")
    return path


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return path


def _issue(
    name: str,
    issuer_key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(root: Path) -> Pki:
    """A throw-away CA with a server certificate for 127.0.0.1 and a client certificate, written under `root`."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "summaryd test CA")])
    ca_cert = _issue("summaryd test CA", ca_key, ca_name, ca_key, ca=True)
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    pem = serialization.Encoding.PEM
    (root / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    (root / "server.pem").write_bytes(_issue("127.0.0.1", ca_key, ca_name, server_key, server=True).public_bytes(pem))
    (root / "client.pem").write_bytes(_issue("trainer", ca_key, ca_name, client_key).public_bytes(pem))
    return Pki(
        root / "ca.pem",
        root / "server.pem",
        _write_key(root / "server.key", server_key),
        root / "client.pem",
        _write_key(root / "client.key", client_key),
    )


def tls_credentials(pki: Pki, *, client_cert: bool) -> grpc.ChannelCredentials:
    """Channel credentials trusting the PKI's CA, presenting its client certificate when `client_cert`."""
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca.read_bytes(),
        private_key=pki.client_key.read_bytes() if client_cert else None,
        certificate_chain=pki.client_cert.read_bytes() if client_cert else None,
    )
