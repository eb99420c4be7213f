"""Certificates for TLS tests, made with `cryptography`: a CA, a server/client certificate it signs (for 127.0.0.1),
and a second CA with a client certificate of its own (trusted by nobody)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 2


@dataclass(frozen=True)
class Pair:
    cert: str
    key: str


@dataclass(frozen=True)
class Certs:
    ca: str          # the cluster's CA
    node: Pair       # server and client certificate of every node (127.0.0.1), signed by ca
    client: Pair     # an operator's client certificate, signed by ca
    rogue_ca: str
    rogue: Pair      # a client certificate signed by rogue_ca


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)
    return path


def _issue(directory: str, name: str, cn: str, issuer: tuple | None, *, ca: bool = False) -> tuple:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(cn))
               .issuer_name(issuer[0].subject if issuer else _name(cn)).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = (builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False))
    cert = builder.sign(issuer[1] if issuer else key, hashes.SHA256())
    cert_path = _write(os.path.join(directory, f"{name}.pem"),
                       cert.public_bytes(serialization.Encoding.PEM))
    key_path = _write(os.path.join(directory, f"{name}.key"), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert, key, cert_path, key_path


def make(directory: str) -> Certs:
    ca = _issue(directory, "ca", "stator test CA", None, ca=True)
    node = _issue(directory, "node", "127.0.0.1", ca)
    client = _issue(directory, "client", "operator", ca)
    rogue_ca = _issue(directory, "rogue-ca", "someone else's CA", None, ca=True)
    rogue = _issue(directory, "rogue", "intruder", rogue_ca)
    return Certs(ca[2], Pair(node[2], node[3]), Pair(client[2], client[3]), rogue_ca[2], Pair(rogue[2], rogue[3]))
