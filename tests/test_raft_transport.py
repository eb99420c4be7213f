"""Stator's raft transport (meta/raft/wire_format.py, meta/raft/transport.py): the wire format alone, then a real
three-node pysyncobj cluster in this process over real sockets on 127.0.0.1, attacked through its raft port."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from pysyncobj import FAIL_REASON, SyncObjException

from meta.raft import wire_format as wire
from meta.raft.transport import HANDSHAKE_TIMEOUT_S, UNAUTHENTICATED_CONNECTIONS_MAX, RaftLink
from meta.raft.wire_format import Kind, Reason, WireError
from ops.devcluster import free_base_port
from tests.support.raft_counter_cluster import (LINK, SECRET, WAIT_S, Cluster, Counter, agree, apply_all, running_cluster,
                                               wait_until)

OTHER_VERSION = wire.WIRE_VERSION + 1   # a version this build does not speak


@pytest.fixture(scope="module")
def keys() -> tuple[bytes, bytes]:
    return LINK.master_key, wire.stretch_secret("not the cluster secret of these tests")


# -- raft_wire -------------------------------------------------------------------------------------------------
def _tuples(value: Any) -> Any:
    """What a message looks like after the wire: arrays come back as tuples."""
    if isinstance(value, (list, tuple)):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def pysyncobj_messages() -> list[dict[str, Any]]:
    """Every message shape pysyncobj 0.3.17 sends (syncobj.py), plus Stator's keepalive."""
    return [
        {"type": "append_entries", "term": 3, "commit_index": 9, "prevLogIdx": 9, "prevLogTerm": 2,
         "entries": [(b"", 10, 3), (b"\x01" + os.urandom(299), 11, 3), (os.urandom(8 * 1024 * 1024), 12, 3)]},
        {"type": "append_entries", "term": 3, "commit_index": 9, "prevLogIdx": None, "prevLogTerm": None,
         "entries": []},
        {"type": "append_entries", "transmission": "start", "data": os.urandom(1000), "term": 3, "commit_index": 9,
         "prevLogIdx": 9, "prevLogTerm": 2},
        {"type": "append_entries", "term": 3, "commit_index": 9, "serialized": (os.urandom(4096), True, False)},
        {"type": "append_entries", "term": 3, "commit_index": 9, "serialized": None},
        {"type": "next_node_idx", "next_node_idx": 13, "reset": False, "success": True},
        {"type": "request_vote", "term": 4, "last_log_index": 12, "last_log_term": 3},
        {"type": "response_vote", "term": 4},
        {"type": "apply_command", "command": b"\x00" + os.urandom(100), "request_id": 7},
        {"type": "apply_command", "command": b"\x00"},
        {"type": "apply_command_response", "request_id": 7, "log_idx": 13, "log_term": 4},
        {"type": "apply_command_response", "request_id": 8, "error": FAIL_REASON.NOT_LEADER},
        {"type": "timeout_now", "term": 4},
        {"type": "keepalive"},
    ]


def _hellos(address_c: str = "127.0.0.1:2", address_s: str = "127.0.0.1:1") -> tuple[bytes, bytes]:
    return (wire.encode_hello(os.urandom(32), address_c), wire.encode_hello(os.urandom(32), address_s))


def _pair(master_c: bytes, master_s: bytes | None = None) -> tuple[wire.Session, wire.Session]:
    client_hello, server_hello = _hellos()
    return (wire.Session(master_c, client_hello, server_hello, is_client=True),
            wire.Session(master_s or master_c, client_hello, server_hello, is_client=False))


def _body(pieces: tuple[bytes, bytes]) -> bytes:
    """A sealed frame's body (its length prefix dropped), as the receiver's FrameReader hands it over."""
    return b"".join(pieces)[wire.LENGTH.size:]


def test_every_pysyncobj_message_survives_codec_and_session(keys):
    messages = pysyncobj_messages()
    batches, too_large = wire.pack_batches(messages)
    assert len(batches) == 1 and not too_large
    client, server = _pair(keys[0])
    reader = wire.FrameReader()
    reader.feed(b"".join(client.seal(Kind.MESSAGES, batches[0])))
    kind, plaintext = server.open(reader.next())
    decoded = wire.decode_messages(plaintext)
    assert kind == Kind.MESSAGES
    assert decoded == tuple(_tuples(m) for m in messages)
    entries = decoded[0]["entries"]
    assert [type(e[0]) for e in entries] == [bytes, bytes, bytes]
    assert [len(e[0]) for e in entries] == [0, 300, 8 * 1024 * 1024]
    assert decoded[3]["serialized"][1:] == (True, False)


def test_sealed_frames_fail_when_tampered_replayed_reordered_or_under_another_key(keys):
    right, wrong = keys
    client, server = _pair(right)
    first = _body(client.seal(Kind.MESSAGES, wire.encode_messages([{"type": "keepalive"}])))
    second = _body(client.seal(Kind.MESSAGES, wire.encode_messages([{"type": "keepalive"}])))
    with pytest.raises(wire.AuthenticationFailed):      # reordered: the second before the first
        server.open(second)
    assert server.open(first)[0] == Kind.MESSAGES
    with pytest.raises(wire.AuthenticationFailed):      # replayed
        server.open(first)
    tampered = bytearray(second)
    tampered[len(tampered) // 2] ^= 0x01
    with pytest.raises(wire.AuthenticationFailed):
        server.open(bytes(tampered))
    with pytest.raises(wire.AuthenticationFailed):      # the kind byte is authenticated too
        server.open(bytes([Kind.AUTH]) + second[1:])
    assert server.open(second)[0] == Kind.MESSAGES      # a failure does not advance the counter
    impostor, victim = _pair(wrong, right)
    with pytest.raises(wire.AuthenticationFailed):      # sealed under a key from another secret
        victim.open(_body(impostor.seal(Kind.AUTH, b"127.0.0.1:2")))
    _, other_connection = _pair(right)
    replay_elsewhere = _body(_pair(right)[0].seal(Kind.AUTH, b"127.0.0.1:2"))
    with pytest.raises(wire.AuthenticationFailed):      # another connection's nonces, so another key
        other_connection.open(replay_elsewhere)


def test_counter_exhaustion_ends_the_session(keys):
    client, server = _pair(keys[0])
    client.sent = server.received = wire.COUNTER_MAX
    assert server.open(_body(client.seal(Kind.MESSAGES, b"\x90")))[1] == b"\x90"
    with pytest.raises(wire.CounterExhausted):
        client.seal(Kind.MESSAGES, b"\x90")
    with pytest.raises(wire.CounterExhausted):
        server.open(b"\x04" + bytes(32))


def test_handshake_refuses_other_versions_and_garbage_by_name():
    nonce = os.urandom(32)
    hello = wire.parse_handshake(wire.encode_hello(nonce, "127.0.0.1:7001"))
    assert hello == wire.Hello(wire.WIRE_VERSION, nonce, "127.0.0.1:7001")
    with pytest.raises(WireError) as refused:
        wire.parse_handshake(wire.encode_hello(nonce, "127.0.0.1:7001", version=OTHER_VERSION))
    assert refused.value.reason == Reason.WIRE_VERSION and refused.value.fields["peer_version"] == OTHER_VERSION
    assert f"speaks raft wire version {OTHER_VERSION}, this node {wire.WIRE_VERSION}" in str(refused.value)
    for garbage in (b"", b"GET / HTTP/1.1\r\n", os.urandom(200), b"STATOR-RAF" + bytes(40)):
        with pytest.raises(WireError) as refused:
            wire.parse_handshake(garbage)
        assert refused.value.reason == Reason.BAD_MAGIC
    good = wire.encode_hello(nonce, "127.0.0.1:7001")
    for malformed in (good[:-1], good + b"x", good[:14] + nonce):
        with pytest.raises(WireError) as refused:
            wire.parse_handshake(malformed)
        assert refused.value.reason == Reason.MALFORMED_HELLO
    with pytest.raises(ValueError):
        wire.encode_hello(nonce, "x" * 256)
    # A REFUSE of any version parses: the refused side can name the refuser's version.
    future_refusal = struct.pack("<11sHB", wire.MAGIC, 9, Kind.REFUSE) + bytes([12]) + b"wire_version"
    assert wire.parse_handshake(future_refusal) == wire.Refusal(9, "wire_version")
    assert wire.parse_handshake(wire.encode_refusal("unknown_node")) == wire.Refusal(wire.WIRE_VERSION, "unknown_node")


def test_frame_reader_reassembles_and_refuses_oversized_lengths():
    reader = wire.FrameReader()
    stream = wire.frame(b"one") + wire.frame(b"") + wire.frame(b"three" * 1000)
    for i in range(0, len(stream), 7):
        reader.feed(stream[i:i + 7])
    assert [reader.next(), reader.next(), reader.next(), reader.next()] == [b"one", b"", b"three" * 1000, None]
    reader.feed(wire.LENGTH.pack(wire.FRAME_BYTES_MAX + 1))
    with pytest.raises(WireError) as refused:
        reader.next()
    assert refused.value.reason == Reason.FRAME_TOO_LARGE
    reader = wire.FrameReader()
    reader.feed(wire.LENGTH.pack(wire.HANDSHAKE_FRAME_BYTES_MAX + 1))
    with pytest.raises(WireError):
        reader.next(wire.HANDSHAKE_FRAME_BYTES_MAX)


@pytest.mark.parametrize("payload", [
    b"\x80",                                   # a map, not a list
    b"\x91\x01",                               # [1]
    b"\x91\x81\xa1a\x01",                      # [{'a': 1}]: no type
    b"\x91\x81\xa4type\x01",                   # [{'type': 1}]
    b"\x91\x81\x01\xa1x",                      # [{1: 'x'}]: a non-str key
    b"\x91\xd4\x05\x00",                       # [ExtType(5)]
    b"\x90\x90",                               # extra data after the list
    b"\xdd\xff\xff\xff\xff",                   # an array of 2**32-1 items declared
    os.urandom(64),
], ids=["map", "int", "no-type", "int-type", "int-key", "ext", "extra", "huge-array", "random"])
def test_decoded_payload_must_be_a_list_of_typed_dicts(payload):
    with pytest.raises(WireError) as refused:
        wire.decode_messages(payload)
    assert refused.value.reason == Reason.PROTOCOL_VIOLATION


def test_a_batch_past_the_frame_limit_splits_in_order(monkeypatch):
    monkeypatch.setattr(wire, "MESSAGES_BYTES_MAX", 1000)
    messages = [{"type": "apply_command", "command": bytes([i]) * 300} for i in range(7)]
    messages.insert(3, {"type": "apply_command", "command": b"x" * 2000})
    batches, too_large = wire.pack_batches(messages)
    assert len(batches) > 1 and all(len(b) <= 1000 for b in batches)
    assert [m["command"][0] for b in batches for m in wire.decode_messages(b)] == list(range(7))
    assert [len(m["command"]) for m in too_large] == [2000]


# -- a real cluster --------------------------------------------------------------------------------------------


def write_until(nodes: list[Counter], count: int, stop: threading.Event | None = None,
                done: list[int] | None = None) -> int:
    """Writes of 1, one at a time with a deadline, from every node in turn, until ``count`` succeeded (or ``stop``);
    each success appended to ``done``. For a cluster that links are cut in: a command forwarded over a link that
    goes down waits for its answer until the next leader change (pysyncobj has no deadline of its own), and a
    failed write may or may not have applied, so totals are not exact."""
    succeeded, i = 0, 0
    deadline = time.monotonic() + WAIT_S
    while succeeded < count and not (stop is not None and stop.is_set()):
        assert time.monotonic() < deadline, f"{succeeded} of {count} writes in {WAIT_S} s"
        try:
            nodes[i % len(nodes)].add(1, sync=True, timeout=1)
            succeeded += 1
            if done is not None:
                done.append(i)
        except SyncObjException:
            pass
        i += 1
    return succeeded


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from running_cluster()


def test_three_nodes_replicate_writes_from_every_node(cluster):
    start = max(n.total() for n in cluster.nodes)
    apply_all(cluster.nodes, 1000)
    agree(cluster, start + 1000)
    for node in cluster.nodes:
        t = node.transport
        assert t.frames_sent > 0 and t.frames_received > 0 and t.bytes_sent > 0 and t.bytes_received > 0
        assert t.refused == {}
    # Followers acknowledged through the group-commit hook: it saw their acks before they were framed.
    leader = cluster.leader()
    for follower in [n for n in cluster.nodes if n is not leader]:
        assert "next_node_idx" in follower.before_flush
    # An acknowledgement leaves in the poll that brought the entries: a write takes well under a 50 ms period.
    latencies = []
    for i in range(30):
        began = time.monotonic()
        cluster.nodes[i % 3].add(1, sync=True, timeout=5)
        latencies.append(time.monotonic() - began)
    assert sorted(latencies)[15] < 0.05, f"median write {sorted(latencies)[15] * 1000:.1f} ms"
    agree(cluster, start + 1030)


def test_the_raft_port_is_bound_to_the_nodes_own_host(cluster):
    port = int(cluster.addresses[0].rsplit(":", 1)[1])
    with socket.socket() as s:
        s.settimeout(2)
        assert s.connect_ex(("127.0.0.2", port)) != 0    # all of 127/8 is loopback: only 127.0.0.1 is bound


class RawPeer:
    """A hand-driven client of a node's raft port, speaking (or breaking) the wire protocol."""

    def __init__(self, address: str):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.reader = wire.FrameReader()
        self.sent: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.sent.append(data)
        self.sock.sendall(data)

    def frame(self, timeout: float = 5.0) -> bytes:
        self.sock.settimeout(timeout)
        while (body := self.reader.next()) is None:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the node")
            self.reader.feed(data)
        return body

    def closed_by_node(self, timeout: float = 5.0) -> bool:
        """Whether the node closes the connection within ``timeout`` (reading and dropping whatever it sends)."""
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if not self.sock.recv(65536):
                    return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        return False

    def hello(self, claim: str, master: bytes) -> wire.Session:
        """Send a HELLO naming ``claim``, read the node's: the session keys under ``master``."""
        client_hello = wire.encode_hello(os.urandom(32), claim)
        self.send(wire.frame(client_hello))
        return wire.Session(master, client_hello, self.frame(), is_client=True)

    def close(self) -> None:
        self.sock.close()


def test_hostile_peers_are_refused_logged_once_and_the_cluster_keeps_committing(cluster, keys):
    right, wrong = keys
    # The node everybody connects to (lowest address); the raw peers claim to be the one that connects last.
    target, claim = cluster.addresses[0], cluster.addresses[2]
    transport = cluster.nodes[0].transport
    before = dict(transport.refused)
    writes: list[int] = []
    stop = threading.Event()

    def writer() -> None:
        write_until(cluster.nodes, 10 ** 9, stop, writes)   # (d) cuts a link: see write_until

    def keeps_committing() -> None:
        seen = len(writes)
        wait_until(lambda: len(writes) >= seen + 5, what="the cluster to keep committing")

    thread = threading.Thread(target=writer, daemon=True)
    with structlog.testing.capture_logs() as logs:
        idle = RawPeer(target)           # says nothing: closed after HANDSHAKE_TIMEOUT_S
        opened_idle = time.monotonic()
        thread.start()
        try:
            # (a) garbage, twice: logged once, counted twice
            for _ in range(2):
                peer = RawPeer(target)
                peer.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(512))
                assert peer.closed_by_node()
                peer.close()
            for _ in range(2):
                peer = RawPeer(target)
                peer.send(wire.frame(b"NOT-STATOR-" + os.urandom(100)))
                assert peer.closed_by_node()
                peer.close()
            keeps_committing()

            # (b) a valid HELLO, then an AUTH sealed under keys from another secret
            peer = RawPeer(target)
            session = peer.hello(claim, wrong)
            peer.send(b"".join(session.seal(Kind.AUTH, claim.encode())))
            assert wire.parse_handshake(peer.frame()) == wire.Refusal(wire.WIRE_VERSION, Reason.AUTH_FAILED)
            assert peer.closed_by_node()
            peer.close()

            # (c) a HELLO of another wire version: refused by name, with the node's own version
            peer = RawPeer(target)
            peer.send(wire.frame(wire.encode_hello(os.urandom(32), claim, version=OTHER_VERSION)))
            assert wire.parse_handshake(peer.frame()) == wire.Refusal(wire.WIRE_VERSION, Reason.WIRE_VERSION)
            assert peer.closed_by_node()
            peer.close()

            # (e) a node this cluster does not have, or itself; and (to the highest node) one that must accept it
            for node, stranger, reason in ((target, "10.9.9.9:1", Reason.UNKNOWN_NODE),
                                           (target, target, Reason.UNKNOWN_NODE),
                                           (claim, target, Reason.WRONG_DIRECTION)):
                peer = RawPeer(node)
                peer.send(wire.frame(wire.encode_hello(os.urandom(32), stranger)))
                assert wire.parse_handshake(peer.frame()) == wire.Refusal(wire.WIRE_VERSION, reason)
                assert peer.closed_by_node()
                peer.close()
            keeps_committing()

            # (d) a real handshake with the secret, which takes over `claim`'s link (until that node reconnects and
            # takes it back), then its frames replayed: in the same segment (before `claim` is back), then on a new
            # connection
            peer = RawPeer(target)
            session = peer.hello(claim, right)
            auth = b"".join(session.seal(Kind.AUTH, claim.encode()))
            keepalive = b"".join(session.seal(Kind.MESSAGES, wire.encode_messages([{"type": "keepalive"}])))
            captured = [*peer.sent, auth, keepalive]
            peer.send(auth + keepalive + keepalive)   # the second keepalive: replayed within the connection
            assert session.open(peer.frame()) == (Kind.AUTH, target.encode())   # the node took the real ones
            assert peer.closed_by_node()
            peer.close()
            replay = RawPeer(target)
            replay.send(b"".join(captured))      # HELLO, AUTH, MESSAGES of the first connection, in one segment
            assert wire.parse_handshake(replay.frame()).address == target   # the node's fresh HELLO
            assert wire.parse_handshake(replay.frame()) == wire.Refusal(wire.WIRE_VERSION, Reason.AUTH_FAILED)
            assert replay.closed_by_node()
            replay.close()
            keeps_committing()

            # (f) more half-open connections than allowed: the newest are closed at once
            flood = [RawPeer(target) for _ in range(UNAUTHENTICATED_CONNECTIONS_MAX + 3)]
            closed = [p for p in flood if p.closed_by_node(timeout=0.05)]
            assert len(closed) >= 3
            for p in flood:
                p.close()
            keeps_committing()

            # the silent one, at the end of its handshake time
            assert idle.closed_by_node(timeout=max(0.5, HANDSHAKE_TIMEOUT_S + 3 - (time.monotonic() - opened_idle)))
            idle.close()
            keeps_committing()
        finally:
            stop.set()
            thread.join(WAIT_S)

    counted = {reason: n - before.get(reason, 0) for reason, n in transport.refused.items()}
    assert counted[Reason.BAD_MAGIC] >= 2 and counted[Reason.FRAME_TOO_LARGE] >= 2
    assert counted[Reason.AUTH_FAILED] >= 3        # (b), (d) replayed in the connection, (d) on a new one
    assert counted[Reason.WIRE_VERSION] == 1 and counted[Reason.UNKNOWN_NODE] == 2
    assert counted[Reason.HANDSHAKE_TIMEOUT] >= 1 and cluster.nodes[2].transport.refused[Reason.WRONG_DIRECTION] == 1
    assert counted[Reason.TOO_MANY_UNAUTHENTICATED] >= 3
    lines = [(e["peer"], e["reason"]) for e in logs if e["event"] == "raft_peer_refused" and e["node"] == target]
    assert len(lines) == len(set(lines)), f"a (peer, reason) logged twice: {lines}"
    assert {Reason.BAD_MAGIC, Reason.FRAME_TOO_LARGE, Reason.AUTH_FAILED, Reason.WIRE_VERSION, Reason.UNKNOWN_NODE,
            Reason.TOO_MANY_UNAUTHENTICATED, Reason.HANDSHAKE_TIMEOUT} <= {r for _, r in lines}
    version_lines = [e for e in logs if e["event"] == "raft_peer_refused" and e["reason"] == Reason.WIRE_VERSION]
    assert f"speaks raft wire version {OTHER_VERSION}, this node {wire.WIRE_VERSION}" in version_lines[0]["detail"]
    agree(cluster)
    wait_until(lambda: all(n.isNodeConnected(o) for n in cluster.nodes for o in n.otherNodes), what="every link up")


def test_drop_and_add_node(cluster):
    node, peer = cluster.nodes[0], cluster.nodes[1]
    peer_node = next(n for n in node.otherNodes if n.address == cluster.addresses[1])
    wait_until(lambda: node.isNodeConnected(peer_node), what="the link to be up")
    node.on_tick(lambda: node.transport.dropNode(peer_node))
    assert not node.isNodeConnected(peer_node)
    time.sleep(1.0)                                 # > 3 x connectionRetryTime: the link stays down
    assert not node.isNodeConnected(peer_node)
    node.on_tick(lambda: node.transport.addNode(peer_node))
    wait_until(lambda: node.isNodeConnected(peer_node), what="the link back after addNode")
    write_until(cluster.nodes, 10)     # the cut may have cost an election
    agree(cluster)


def test_leader_failover(cluster):
    leader = wait_until(cluster.leader, what="a leader")
    start = agree(cluster)
    leader.destroy_synchronous()
    survivors = cluster.alive()
    assert len(survivors) == 2
    new = wait_until(cluster.leader, what="a new leader")
    assert new is not leader
    write_until(survivors, 100)
    assert agree(cluster) >= start + 100


# -- alone -----------------------------------------------------------------------------------------------------
def test_the_dialing_node_names_the_peers_wire_version():
    """A node that connects to a peer speaking another wire version logs both versions, by name."""
    base = free_base_port()
    peer, me = f"127.0.0.1:{base + 1}", f"127.0.0.1:{base + 2}"   # me sorts higher: me connects
    server = socket.create_server(("127.0.0.1", base + 1))
    server.settimeout(5)
    with structlog.testing.capture_logs() as logs:
        node = Counter(me, [peer])
        try:
            conn, _ = server.accept()
            conn.settimeout(5)
            reader = wire.FrameReader()
            while (hello := reader.next()) is None:
                reader.feed(conn.recv(4096))
            assert wire.parse_handshake(hello).address == me
            conn.sendall(wire.frame(struct.pack("<11sHB", wire.MAGIC, OTHER_VERSION, Kind.REFUSE)
                                    + b"\x0cwire_version"))
            wait_until(lambda: node.transport.refused.get(Reason.WIRE_VERSION), what="the refusal counted")
            conn.close()
        finally:
            node.destroy_synchronous()
            server.close()
    lines = [e for e in logs if e["event"] == "raft_peer_refused" and e["reason"] == Reason.WIRE_VERSION]
    assert len(lines) == 1
    assert lines[0]["detail"] == f"peer {peer} speaks raft wire version {OTHER_VERSION}, this node {wire.WIRE_VERSION}"


def _accept_as_peer(server: socket.socket, me: str, peer: str) -> tuple[RawPeer, wire.Session]:
    """The hand-driven peer ``peer``'s side of a handshake with the node ``me`` that dials it: the link is then up."""
    conn, _ = server.accept()
    raw = RawPeer.__new__(RawPeer)
    raw.sock, raw.reader, raw.sent = conn, wire.FrameReader(), []
    client_hello = raw.frame()
    assert wire.parse_handshake(client_hello).address == me
    server_hello = wire.encode_hello(os.urandom(32), peer)
    raw.send(wire.frame(server_hello))
    session = wire.Session(LINK.master_key, client_hello, server_hello, is_client=False)
    assert session.open(raw.frame()) == (Kind.AUTH, me.encode())
    raw.send(b"".join(session.seal(Kind.AUTH, peer.encode())))
    return raw, session


def test_the_dialing_side_completes_a_handshake_and_closes_a_silent_link():
    """The node connects to a hand-driven peer: handshake, pysyncobj's messages through it, then the peer goes
    silent and the node closes the link after conf.connectionTimeout (onNodeDisconnected)."""
    base = free_base_port()
    peer, me = f"127.0.0.1:{base + 1}", f"127.0.0.1:{base + 2}"
    server = socket.create_server(("127.0.0.1", base + 1))
    server.settimeout(5)
    node = Counter(me, [peer], connectionTimeout=1.0)
    try:
        raw, session = _accept_as_peer(server, me, peer)
        conn = raw.sock
        went_silent = time.monotonic()                   # the last bytes this peer sends
        partner = next(iter(node.otherNodes))
        wait_until(lambda: node.isNodeConnected(partner), what="the link up")
        kind, plaintext = session.open(raw.frame())      # a lone follower with a partner asks for votes
        assert kind == Kind.MESSAGES and wire.decode_messages(plaintext)[0]["type"] == "request_vote"
        assert raw.closed_by_node(timeout=5)
        assert 0.9 < time.monotonic() - went_silent < 3
        wait_until(lambda: not node.isNodeConnected(partner), what="the link down")
        conn.close()
    finally:
        node.destroy_synchronous()
        server.close()


def test_a_link_whose_frame_never_completes_is_closed_though_bytes_keep_coming():
    """A length prefix damaged in flight (found by the simulator: a flipped bit turned 80 bytes into 1,048,656) makes
    the reader wait for a frame that never completes while later frames' bytes keep arriving: the node closes the link
    after conf.connectionTimeout without a whole frame, as it closes a silent one."""
    base = free_base_port()
    peer, me = f"127.0.0.1:{base + 1}", f"127.0.0.1:{base + 2}"
    server = socket.create_server(("127.0.0.1", base + 1))
    server.settimeout(5)
    node = Counter(me, [peer], connectionTimeout=1.0)
    try:
        raw, _session = _accept_as_peer(server, me, peer)
        conn = raw.sock
        partner = next(iter(node.otherNodes))
        wait_until(lambda: node.isNodeConnected(partner), what="the link up")
        raw.send(struct.pack("<I", 1_048_656))       # a frame announced, never finished
        last_frame = time.monotonic()
        trickled = 0
        while node.isNodeConnected(partner) and time.monotonic() - last_frame < 5:
            with contextlib.suppress(OSError):
                raw.send(b"\0" * 64)                  # bytes keep coming: a byte-based idle timeout never fires
                trickled += 64
            time.sleep(0.05)
        assert not node.isNodeConnected(partner), f"the link stayed up after {trickled} bytes of an unfinished frame"
        assert 0.9 < time.monotonic() - last_frame < 3
        conn.close()
    finally:
        node.destroy_synchronous()
        server.close()


def test_a_taken_port_fails_after_max_bind_retries():
    base = free_base_port()
    address = f"127.0.0.1:{base + 1}"
    with socket.create_server(("127.0.0.1", base + 1)):
        began = time.monotonic()
        with pytest.raises(SyncObjException):
            Counter(address, [f"127.0.0.1:{base + 2}"], autoTick=False, bindRetryTime=0.05, maxBindRetries=3)
        assert time.monotonic() - began < 2


def test_raft_link_needs_a_secret_and_keeps_it_out_of_repr():
    with pytest.raises(ValueError):
        RaftLink(secret="")
    assert SECRET not in repr(LINK)
