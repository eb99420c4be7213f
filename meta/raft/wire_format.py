"""The raft transport's wire format: framing, handshake, keys, AEAD sessions and the message codec. No sockets here.

Replaces pysyncobj's pickle + zlib + Fernet: a peer's bytes are authenticated before anything looks inside them, and
what is then decoded is msgpack data (dicts, tuples, bytes, str, int, bool, None), never objects that run code.

Every frame is ``u32 length (little-endian) | body``, the body at most FRAME_BYTES_MAX bytes (HANDSHAKE_FRAME_BYTES_MAX
until the peer is authenticated). A connection carries, in each direction, one plaintext handshake frame and then
sealed frames only:

    ======================  ======================================================================================
    frame                   body
    ======================  ======================================================================================
    HELLO   (plaintext)     MAGIC b"STATOR-RAFT" (11) | u16 version | u8 kind=1 | nonce (32 random bytes)
                            | u8 n | the sender's raft address, utf-8 (n <= 255 bytes)
    REFUSE  (plaintext)     MAGIC (11) | u16 the refuser's version | u8 kind=2 | u8 n | reason, ascii (n <= 64)
    AUTH    (sealed)        u8 kind=3 | AES-256-GCM(the sender's raft address, utf-8) incl. 16-byte tag
    MESSAGES (sealed)       u8 kind=4 | AES-256-GCM(msgpack array of pysyncobj's message dicts) incl. 16-byte tag
    ======================  ======================================================================================

The first 14 bytes of a handshake frame (magic, version, kind) and the whole REFUSE layout stay the same in every
wire version, so that any two versions can tell each other, by name, why they cannot talk.

Handshake (the node whose address sorts higher connects)::

    client -> server  HELLO(client nonce, client address)
    server -> client  HELLO(server nonce, server address)     or REFUSE(server version, reason), then close
    client -> server  AUTH(client address)                    first sealed frame, counter 0
    server -> client  AUTH(server address)                    only after the client's AUTH opened
    ...               MESSAGES in both directions

Keys: ``master = PBKDF2-HMAC-SHA256(secret, SECRET_STRETCH_SALT, SECRET_STRETCH_ITERATIONS)`` once per process (the
cluster secret is a human-chosen string: the stretch is what an offline guess of it costs), then per connection
``HKDF-SHA256(master, salt = client nonce | server nonce, info = KEY_LABEL | SHA-256(client HELLO frame | server
HELLO frame), 64 bytes)``: the first 32 bytes seal client -> server, the last 32 server -> client. The transcript hash
in ``info`` binds both HELLOs (addresses, versions, nonces) to the keys. The server sends its AUTH only after the
client's opened, so a peer without the secret never gets a sealed frame it could test guesses of the secret against.

Sealed frames: AEAD nonce = 4 zero bytes | u64 little-endian frame counter of that direction (0 for AUTH, +1 per
frame); the kind byte is the associated data. The receiver opens each frame with exactly the next counter it
expects, so a replayed, reordered, dropped or tampered frame fails authentication, as does one sealed under another
key (wrong secret, or a frame from another connection). Authentication comes before any decoding.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

MAGIC = b"STATOR-RAFT"
# 2: pre-votes (meta/raft/prevote.py). A node of version 1 never answers one, and one of version 2 never campaigns
# without a majority of answers: the two must refuse each other by name rather than never elect.
WIRE_VERSION = 2
FRAME_BYTES_MAX = 64 * 1024 * 1024
# Until the peer proved it knows the secret, no frame may be larger than a handshake needs (a HELLO is <= 302
# bytes, an AUTH <= 272): 32 half-open connections must not make the node buffer 32 x 64 MiB.
HANDSHAKE_FRAME_BYTES_MAX = 1024
HELLO_NONCE_BYTES = 32
ADDRESS_BYTES_MAX = 255
REASON_BYTES_MAX = 64
KEY_BYTES = 32
TAG_BYTES = 16
COUNTER_MAX = 2 ** 64 - 1
# OWASP's 2023 figure for PBKDF2-HMAC-SHA256 (~0.2 s here, once per process): cluster secrets are human-chosen
# strings of >= 16 characters (runtime/config_file.py), and pysyncobj's Fernet key cost 100,000 iterations already.
SECRET_STRETCH_ITERATIONS = 600_000
SECRET_STRETCH_SALT = b"stator raft wire secret v1"
KEY_LABEL = b"stator raft wire v1 keys"
STRETCHED_SECRETS_CACHED = 4
# A sealed MESSAGES frame's plaintext: the frame minus its kind byte and the AEAD tag.
MESSAGES_BYTES_MAX = FRAME_BYTES_MAX - 1 - TAG_BYTES
# Decoder limits, each below what one frame could declare, so a hostile length never allocates.
DECODE_BIN_BYTES_MAX = MESSAGES_BYTES_MAX
DECODE_STR_BYTES_MAX = 1024 * 1024           # pysyncobj's str values are key-like ('append_entries', 'start')
DECODE_ARRAY_ITEMS_MAX = 1024 * 1024         # messages per frame, entries per append (batch bytes / entry size)
DECODE_MAP_ITEMS_MAX = 64                    # a pysyncobj message has at most 8 keys

LENGTH = struct.Struct("<I")
_HANDSHAKE_HEAD = struct.Struct(f"<{len(MAGIC)}sHB")   # magic, version, kind
_NONCE = struct.Struct("<4xQ")


class Kind(enum.IntEnum):
    HELLO = 1
    REFUSE = 2
    AUTH = 3
    MESSAGES = 4


class Reason:
    """Why a connection was refused or closed: the names that appear in logs, counters and REFUSE frames."""
    BAD_MAGIC = "bad_magic"                  # not our protocol (garbage, a port scan, an HTTP client)
    WIRE_VERSION = "wire_version"            # a raft wire version this node does not speak
    MALFORMED_HELLO = "malformed_hello"
    FRAME_TOO_LARGE = "frame_too_large"
    AUTH_FAILED = "auth_failed"              # wrong secret, replayed, reordered or tampered frame
    AUTH_MISMATCH = "auth_mismatch"          # AUTH names another node than its HELLO
    PROTOCOL_VIOLATION = "protocol_violation"  # authenticated, but not frames/messages of this protocol
    UNKNOWN_NODE = "unknown_node"            # a raft address not in this node's cluster
    WRONG_DIRECTION = "wrong_direction"      # that node must accept from us, not connect to us
    REFUSED_BY_PEER = "refused_by_peer"      # the peer sent a REFUSE
    COUNTER_EXHAUSTED = "counter_exhausted"  # 2**64 frames in one direction: reconnect for fresh keys
    HANDSHAKE_TIMEOUT = "handshake_timeout"
    TOO_MANY_UNAUTHENTICATED = "too_many_unauthenticated"
    TLS = "tls"                              # the TLS handshake failed (no, or an untrusted, certificate; not TLS)


class WireError(Exception):
    """A frame this side refuses; ``reason`` is one of ``Reason``, ``fields`` go to the log line."""

    def __init__(self, reason: str, detail: str = "", **fields: Any):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.fields = fields


class AuthenticationFailed(WireError):
    def __init__(self, detail: str = "") -> None:
        super().__init__(Reason.AUTH_FAILED, detail)


class CounterExhausted(WireError):
    def __init__(self) -> None:
        super().__init__(Reason.COUNTER_EXHAUSTED, "2**64 frames sealed or opened with these keys")


# -- framing ---------------------------------------------------------------------------------------------------
def frame(body: bytes) -> bytes:
    if len(body) > FRAME_BYTES_MAX:
        raise ValueError(f"a frame of {len(body)} bytes is above FRAME_BYTES_MAX ({FRAME_BYTES_MAX})")
    return LENGTH.pack(len(body)) + body


class FrameReader:
    """Bytes in, whole frame bodies out; a declared length above the limit is refused before it is buffered."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buf += data

    def next(self, limit: int = FRAME_BYTES_MAX) -> bytes | None:
        buf = self._buf
        if len(buf) < LENGTH.size:
            return None
        (length,) = LENGTH.unpack_from(buf)
        if length > limit:
            raise WireError(Reason.FRAME_TOO_LARGE, f"a frame of {length} bytes, at most {limit} taken here",
                            frame_bytes=length)
        end = LENGTH.size + length
        if len(buf) < end:
            return None
        with memoryview(buf) as view:
            body = bytes(view[LENGTH.size:end])
        del buf[:end]      # bytearray drops a prefix without moving the rest
        return body

    @property
    def buffered(self) -> int:
        return len(self._buf)


# -- handshake -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hello:
    version: int
    nonce: bytes
    address: str


@dataclass(frozen=True)
class Refusal:
    version: int      # the refuser's own wire version
    reason: str


def encode_hello(nonce: bytes, address: str, version: int = WIRE_VERSION) -> bytes:
    """A HELLO body (``version`` is a parameter only so that tests can speak another one)."""
    if len(nonce) != HELLO_NONCE_BYTES:
        raise ValueError(f"a HELLO nonce is {HELLO_NONCE_BYTES} bytes")
    raw = address.encode()
    if not raw or len(raw) > ADDRESS_BYTES_MAX:
        raise ValueError(f"a raft address is 1 to {ADDRESS_BYTES_MAX} bytes of utf-8: {address[:300]!r}")
    return _HANDSHAKE_HEAD.pack(MAGIC, version, Kind.HELLO) + nonce + bytes([len(raw)]) + raw


def encode_refusal(reason: str) -> bytes:
    raw = reason.encode("ascii")[:REASON_BYTES_MAX]
    return _HANDSHAKE_HEAD.pack(MAGIC, WIRE_VERSION, Kind.REFUSE) + bytes([len(raw)]) + raw


def parse_handshake(body: bytes) -> Hello | Refusal:
    """The peer's first frame. Raises WireError: BAD_MAGIC, WIRE_VERSION (``peer_version`` in fields) or
    MALFORMED_HELLO. A REFUSE of any version is returned, so the refused side can log the refuser's version."""
    if len(body) < _HANDSHAKE_HEAD.size or not body.startswith(MAGIC):
        raise WireError(Reason.BAD_MAGIC, "not a raft wire handshake")
    _, version, kind = _HANDSHAKE_HEAD.unpack_from(body)
    rest = body[_HANDSHAKE_HEAD.size:]
    if kind == Kind.REFUSE:
        return Refusal(version, _short_text(rest, REASON_BYTES_MAX, "reason").decode("ascii", "replace"))
    if version != WIRE_VERSION:
        raise WireError(Reason.WIRE_VERSION, f"speaks raft wire version {version}, this node {WIRE_VERSION}",
                        peer_version=version, wire_version=WIRE_VERSION)
    if kind != Kind.HELLO or len(rest) < HELLO_NONCE_BYTES:
        raise WireError(Reason.MALFORMED_HELLO, f"kind {kind}, {len(body)} bytes")
    try:
        address = _short_text(rest[HELLO_NONCE_BYTES:], ADDRESS_BYTES_MAX, "address").decode()
    except UnicodeDecodeError:
        raise WireError(Reason.MALFORMED_HELLO, "the address is not utf-8") from None
    if not address:
        raise WireError(Reason.MALFORMED_HELLO, "an empty address")
    return Hello(version, bytes(rest[:HELLO_NONCE_BYTES]), address)


def _short_text(data: bytes, limit: int, what: str) -> bytes:
    """A u8-length-prefixed string that must fill the rest of the frame exactly."""
    if not data or data[0] > limit or len(data) != 1 + data[0]:
        raise WireError(Reason.MALFORMED_HELLO, f"a bad {what} length")
    return bytes(data[1:])


# -- keys ------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=STRETCHED_SECRETS_CACHED)
def stretch_secret(secret: str) -> bytes:
    """The master key of a cluster secret: what every connection's keys are derived from. ~0.2 s, so cached: a
    process that builds its SyncObj again (tests, restarts in place) pays it once per secret."""
    if not secret:
        raise ValueError("the cluster secret must not be empty")
    kdf = PBKDF2HMAC(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=SECRET_STRETCH_SALT,
                     iterations=SECRET_STRETCH_ITERATIONS)
    return kdf.derive(secret.encode())


def session_keys(master: bytes, client_hello: bytes, server_hello: bytes) -> tuple[bytes, bytes]:
    """(client -> server key, server -> client key) for the two HELLO bodies of one handshake."""
    client, server = parse_handshake(client_hello), parse_handshake(server_hello)
    if not isinstance(client, Hello) or not isinstance(server, Hello):
        raise ValueError("session keys need two HELLOs")
    transcript = hashlib.sha256(frame(client_hello) + frame(server_hello)).digest()
    hkdf = HKDF(algorithm=hashes.SHA256(), length=2 * KEY_BYTES, salt=client.nonce + server.nonce,
                info=KEY_LABEL + transcript)
    okm = hkdf.derive(master)
    return okm[:KEY_BYTES], okm[KEY_BYTES:]


class Session:
    """One connection's two AEAD directions, each with its frame counter. Not thread-safe (one tick at a time)."""

    __slots__ = ("_sealer", "_opener", "sent", "received")

    def __init__(self, master: bytes, client_hello: bytes, server_hello: bytes, is_client: bool):
        to_server, to_client = session_keys(master, client_hello, server_hello)
        self._sealer = AESGCM(to_server if is_client else to_client)
        self._opener = AESGCM(to_client if is_client else to_server)
        self.sent = 0        # the counter of the next frame this side seals
        self.received = 0    # the counter the next frame from the peer must have been sealed with

    def seal(self, kind: Kind, plaintext: bytes) -> tuple[bytes, bytes]:
        """The frame as (length prefix + kind byte, ciphertext): two pieces, so a large one is never copied to
        prepend three bytes. Raises CounterExhausted after 2**64 frames."""
        counter = self.sent
        if counter > COUNTER_MAX:
            raise CounterExhausted()
        ad = _KIND_BYTES[kind]
        sealed = self._sealer.encrypt(_NONCE.pack(counter), plaintext, ad)
        self.sent = counter + 1
        return LENGTH.pack(1 + len(sealed)) + ad, sealed

    def open(self, body: bytes) -> tuple[Kind, bytes]:
        """(kind, plaintext) of a sealed frame body. Raises AuthenticationFailed (wrong key, replay, reorder, drop,
        tamper, unknown kind) or CounterExhausted; the expected counter only advances on success."""
        counter = self.received
        if counter > COUNTER_MAX:
            raise CounterExhausted()
        if len(body) < 1 + TAG_BYTES or body[0] not in _SEALED_KINDS:
            raise AuthenticationFailed(f"a sealed frame of {len(body)} bytes")
        with memoryview(body) as view:
            try:
                plaintext = self._opener.decrypt(_NONCE.pack(counter), view[1:], view[:1])
            except InvalidTag:
                raise AuthenticationFailed(f"frame {counter} does not open with this connection's key") from None
        self.received = counter + 1
        return _KIND_OF[body[0]], plaintext


_SEALED_KINDS = frozenset({Kind.AUTH, Kind.MESSAGES})
_KIND_BYTES = {kind: bytes([kind]) for kind in Kind}
_KIND_OF = {int(kind): kind for kind in _SEALED_KINDS}   # Kind(byte) per frame was an enum call, ~1 us each


# -- messages --------------------------------------------------------------------------------------------------
def encode_messages(messages: Sequence[dict[str, Any]]) -> bytes:
    """msgpack of the list; tuples become arrays (decoded as tuples), bytes stay bytes. TypeError on anything
    else (a pysyncobj message carrying an object: the transport does not ship objects)."""
    return msgpack.packb(messages, use_bin_type=True)


def pack_batches(messages: Sequence[dict[str, Any]]) -> tuple[list[bytes], list[dict[str, Any]]]:
    """The messages as MESSAGES plaintexts, in order: one, unless it would pass MESSAGES_BYTES_MAX; then as many as
    needed. Second: the messages that alone pass it (cannot be sent; pysyncobj sends large entries in pieces)."""
    whole = encode_messages(messages)
    if len(whole) <= MESSAGES_BYTES_MAX:
        return [whole], []
    batches: list[bytes] = []
    too_large: list[dict[str, Any]] = []
    group: list[dict[str, Any]] = []
    size = 0
    for message in messages:
        one = len(encode_messages([message]))   # its array header (1 byte) is paid once by the group
        if one > MESSAGES_BYTES_MAX:
            too_large.append(message)
            continue
        if group and size + one > MESSAGES_BYTES_MAX - _ARRAY_HEADER_BYTES_MAX:
            batches.append(encode_messages(group))
            group, size = [], 0
        group.append(message)
        size += one
    if group:
        batches.append(encode_messages(group))
    return batches, too_large


_ARRAY_HEADER_BYTES_MAX = 5


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code}: not part of this protocol")


def decode_messages(data: bytes) -> tuple[dict[str, Any], ...]:
    """The messages of a MESSAGES plaintext: a list of dicts, each with a str 'type'. WireError otherwise."""
    try:
        messages = msgpack.unpackb(data, raw=False, use_list=False, strict_map_key=True, ext_hook=_refuse_ext,
                                   max_bin_len=DECODE_BIN_BYTES_MAX, max_str_len=DECODE_STR_BYTES_MAX,
                                   max_array_len=DECODE_ARRAY_ITEMS_MAX, max_map_len=DECODE_MAP_ITEMS_MAX,
                                   max_ext_len=0)
    except Exception as e:   # msgpack raises ValueError, its own FormatError/StackError/ExtraData, UnicodeError...
        raise WireError(Reason.PROTOCOL_VIOLATION, f"not msgpack of this protocol: {type(e).__name__}") from None
    if not isinstance(messages, tuple):
        raise WireError(Reason.PROTOCOL_VIOLATION, f"a frame holds a {type(messages).__name__}, not a list")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise WireError(Reason.PROTOCOL_VIOLATION, "a message that is not a dict with a str 'type'")
    return messages
