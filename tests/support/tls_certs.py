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


def issue(cn: str, issuer: tuple | None, *, names: tuple[str, ...] = (), ips: tuple[str, ...] = ()) -> tuple:
    """(certificate, key): a CA when ``issuer`` is None, else a server/client certificate ``issuer`` signs for the
    DNS ``names`` and ``ips`` given. With neither, it carries no subjectAltName at all: a client certificate names
    nobody's address, and cryptography >= 51 refuses an empty one."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(cn))
               .issuer_name(issuer[0].subject if issuer else _name(cn)).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True))
    if issuer is not None:
        sans = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256()), key


def write_cert(directory: str, stem: str, cert) -> str:
    return _write(os.path.join(directory, f"{stem}.pem"), cert.public_bytes(serialization.Encoding.PEM))


def write_pair(directory: str, stem: str, cert, key) -> Pair:
    return Pair(write_cert(directory, stem, cert), _write(os.path.join(directory, f"{stem}.key"), key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())))


def make(directory: str) -> Certs:
    ca = issue("stator test CA", None)
    local = {"names": ("localhost",), "ips": ("127.0.0.1",)}
    rogue_ca = issue("someone else's CA", None)
    return Certs(write_cert(directory, "ca", ca[0]),
                 write_pair(directory, "node", *issue("127.0.0.1", ca, **local)),
                 write_pair(directory, "client", *issue("operator", ca, **local)),
                 write_cert(directory, "rogue-ca", rogue_ca[0]),
                 write_pair(directory, "rogue", *issue("intruder", rogue_ca, **local)))
