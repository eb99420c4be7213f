"""A Server-Sent Events parser that does no I/O (the WHATWG event-stream rules, h11 style): bytes in, events out.

Lines end with LF, CRLF or CR. ``field: value`` (one space after the colon is dropped); ``data`` lines of one event are
joined with LF; a line starting with ``:`` is a comment (the server's keepalive); a blank line dispatches the event.
An event without data is not dispatched. ``id`` persists across events, as the spec says, and is what a client sends
back as ``after`` / ``Last-Event-ID`` when it reconnects. The input buffer is bounded.
"""

from __future__ import annotations

from dataclasses import dataclass

LINE_BYTES_MAX = 64 * 1024 * 1024   # one route of a 16,384-queue topic is a few MiB; anything near this is a bug
EVENT_BYTES_MAX = 64 * 1024 * 1024


class SseProtocolError(Exception):
    """The stream broke the rules or a bound (a line or an event too long)."""


@dataclass(frozen=True)
class SseEvent:
    event: str
    data: str
    id: str | None


class SseParser:
    def __init__(self, line_bytes_max: int = LINE_BYTES_MAX, event_bytes_max: int = EVENT_BYTES_MAX):
        self._buf = bytearray()
        self._line_bytes_max = line_bytes_max
        self._event_bytes_max = event_bytes_max
        self._event = ""
        self._data: list[str] = []
        self._data_bytes = 0
        self._skip_lf = False  # the previous chunk ended in CR: a leading LF of the next one belongs to it
        self.last_id: str | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Take the next bytes of the stream; return the events they completed, in order."""
        if not chunk:
            return []
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        self._buf += chunk
        events: list[SseEvent] = []
        start = 0
        buf = self._buf
        while True:
            cr = buf.find(b"\r", start)
            lf = buf.find(b"\n", start)
            ends = [i for i in (cr, lf) if i >= 0]
            if not ends:
                break
            end = min(ends)
            line = bytes(buf[start:end])
            if buf[end:end + 1] == b"\r":
                if end + 1 == len(buf):
                    self._skip_lf = True  # a CRLF may be split across chunks
                    start = end + 1
                elif buf[end + 1:end + 2] == b"\n":
                    start = end + 2
                else:
                    start = end + 1
            else:
                start = end + 1
            ev = self._line(line)
            if ev is not None:
                events.append(ev)
        del buf[:start]
        if len(buf) > self._line_bytes_max:
            raise SseProtocolError(f"an event-stream line is longer than {self._line_bytes_max} bytes")
        return events

    def _line(self, raw: bytes) -> SseEvent | None:
        if not raw:
            return self._dispatch()
        line = raw.decode("utf-8", "replace")
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data_bytes += len(value) + 1
            if self._data_bytes > self._event_bytes_max:
                raise SseProtocolError(f"an event is longer than {self._event_bytes_max} bytes")
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self.last_id = value
        # "retry" and unknown fields are ignored, as the spec says.
        return None

    def _dispatch(self) -> SseEvent | None:
        event, data = self._event or "message", self._data
        self._event, self._data, self._data_bytes = "", [], 0
        if not data:
            return None
        return SseEvent(event, "\n".join(data), self.last_id)
