"""Routes rendered as JSON once per topic version and shared by every reader, bounded by bytes (LRU)."""

from __future__ import annotations

from collections import OrderedDict


class RouteCache:
    def __init__(self, bytes_max: int):
        self.bytes_max = bytes_max
        self.bytes = 0
        self._entries: OrderedDict[str, tuple[int, bytes]] = OrderedDict()

    def get(self, topic: str, version: int) -> bytes | None:
        entry = self._entries.get(topic)
        if entry is None or entry[0] != version:
            return None
        self._entries.move_to_end(topic)
        return entry[1]

    def put(self, topic: str, version: int, body: bytes) -> None:
        self.drop(topic)
        self._entries[topic] = (version, body)
        self.bytes += len(body)
        while self.bytes > self.bytes_max and len(self._entries) > 1:
            _, (_, old) = self._entries.popitem(last=False)
            self.bytes -= len(old)

    def drop(self, topic: str) -> None:
        entry = self._entries.pop(topic, None)
        if entry is not None:
            self.bytes -= len(entry[1])
