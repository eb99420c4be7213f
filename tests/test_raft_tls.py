"""Mutual TLS on the raft port (meta/raft/transport.py): three nodes whose certificates the cluster's CA signed
replicate; a peer without a certificate, with one of another CA, or without TLS at all never links, is refused as
``tls``, and the cluster keeps committing."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from meta.raft.transport import RaftLink
from tests.support import tls_certs
from tests.support.raft_counter_cluster import SECRET, Cluster, Counter, agree, apply_all, running_cluster, wait_until

CLOSE_WAIT_S = 5.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> tls_certs.Certs:
    return tls_certs.make(str(tmp_path_factory.mktemp("raft-tls")))


@pytest.fixture(scope="module")
def tls_cluster(certs) -> Iterator[Cluster]:
    yield from running_cluster(RaftLink.with_tls(SECRET, certs.node.cert, certs.node.key, certs.ca))


def _refused_tls(node: Counter) -> int:
    return node.on_tick(lambda: node.transport.refused.get("tls", 0))


def _closed_without_a_byte(sock: socket.socket) -> bool:
    """Whether the node ends the connection (EOF, reset or a TLS alert) within CLOSE_WAIT_S, sending no data."""
    sock.settimeout(CLOSE_WAIT_S)
    try:
        return sock.recv(1024) == b""
    except TimeoutError:
        return False
    except (ssl.SSLError, ConnectionError):
        return True


def test_three_nodes_replicate_over_mutual_tls(tls_cluster):
    before = agree(tls_cluster)
    apply_all(tls_cluster.nodes, 300)
    assert agree(tls_cluster) == before + 300
    assert all(n.transport._link.tls for n in tls_cluster.nodes)
    assert all(n.on_tick(lambda n=n: n.transport.refused.get("tls", 0)) == 0 for n in tls_cluster.nodes)


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate", "no TLS at all"])
def test_a_peer_without_the_cas_certificate_is_refused_and_the_cluster_keeps_committing(tls_cluster, certs, who):
    target = tls_cluster.nodes[0]
    host, port = tls_cluster.addresses[0].rsplit(":", 1)
    refused = _refused_tls(target)
    sock = socket.create_connection((host, int(port)), timeout=CLOSE_WAIT_S)
    try:
        if who == "no TLS at all":
            sock.sendall(b"STATOR-RAFT hello in the clear")   # what a node without TLS sends first
        else:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=certs.ca)
            if who == "another CA's certificate":
                ctx.load_cert_chain(certs.rogue.cert, certs.rogue.key)
            try:
                sock = ctx.wrap_socket(sock, server_hostname=host)
                # TLS 1.3 ends the client's side of the handshake before the server judged its certificate: the
                # node's verdict arrives as an alert on the first read.
                sock.sendall(b"STATOR-RAFT")
            except (ssl.SSLError, ConnectionError):
                pass   # refused during the handshake itself (TLS 1.2)
        assert _closed_without_a_byte(sock), f"the node kept a peer with {who} connected"
    finally:
        sock.close()
    wait_until(lambda: _refused_tls(target) > refused, what=f"the node to count the refusal of a peer with {who}")
    before = agree(tls_cluster)
    apply_all(tls_cluster.nodes, 20)
    assert agree(tls_cluster) == before + 20


def test_a_node_without_tls_never_links_to_a_tls_cluster(tls_cluster):
    # Its address sorts above every member's, so it dials them all; each refuses its clear-text HELLO.
    plain_address = f"127.0.0.1:{int(tls_cluster.addresses[2].rsplit(':', 1)[1]) + 10}"
    plain = Counter(plain_address, tls_cluster.addresses)
    try:
        target = tls_cluster.nodes[0]
        refused = _refused_tls(target)
        wait_until(lambda: _refused_tls(target) > refused, what="the TLS node to refuse the plain one")
        time.sleep(1.0)   # several dial attempts: none may link
        assert plain.on_tick(lambda: len(plain.transport._links)) == 0
    finally:
        plain.destroy_synchronous()


def test_a_link_needs_both_contexts_and_both_must_require_certificates(certs):
    full = RaftLink.with_tls(SECRET, certs.node.cert, certs.node.key, certs.ca)
    with pytest.raises(ValueError, match="both contexts"):
        RaftLink(secret=SECRET, server_tls=full.server_tls)
    lax = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)   # CERT_NONE: any client would get in
    with pytest.raises(ValueError, match="mutual"):
        RaftLink(secret=SECRET, server_tls=lax, client_tls=full.client_tls)
