"""TLS material made in the test: a self-signed CA, and a server certificate for 127.0.0.1 it signed.

`make_tls(folder)` writes `ca.pem`, `server.pem` and `server.key` (and a second, unrelated
`other-ca.pem`, to show that a wrong CA fails closed) and returns their paths and bytes; the
suite's receiver serves with them (`OTLPReceiver(tls=...)`). Nothing is downloaded.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class TlsMaterial:
    ca_file: str
    other_ca_file: str
    cert_file: str
    key_file: str
    cert_pem: bytes
    key_pem: bytes


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _ca(common: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name(common)).issuer_name(_name(common))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def make_tls(folder: Path) -> TlsMaterial:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("otel-train test CA")
    _, other_ca = _ca("some other CA")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(_name("127.0.0.1")).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    cert_pem = cert.public_bytes(pem)
    paths = {"ca.pem": ca_cert.public_bytes(pem), "other-ca.pem": other_ca.public_bytes(pem),
             "server.pem": cert_pem, "server.key": key_pem}
    for name, data in paths.items():
        (folder / name).write_bytes(data)
    return TlsMaterial(str(folder / "ca.pem"), str(folder / "other-ca.pem"), str(folder / "server.pem"),
                       str(folder / "server.key"), cert_pem, key_pem)
