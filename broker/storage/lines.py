"""Checked JSON lines: the line format of the broker's small append-only files (offsets.log, pop/journal.log).

A line is ``v1 <crc> <json>\\n``: the format version, the CRC-32 (zlib, 8 lower-case hex digits) of the JSON text's
bytes, and the JSON text. Without the CRC a flipped digit in a line is a different offset or pop state, read back
and served as if it had been committed. Lines of format 0 (the JSON text alone, always a JSON array: what these files
held before) still load, unchecked, so files written by an older broker open as they did.

Reading a file (``read``) tells a torn tail from damage. The files are only appended to (a compaction writes a new
file and renames it), so a write a crash cut short leaves a last line without its newline, or bytes the disk never
got, which read back as zeros:
- a last line without its newline, and bad lines after the last good one that hold a zero byte, are the remains of
  such a write: never acknowledged (each file acknowledges only after an fsync covering the whole write). They are
  left out, and the caller cuts the file back to ``whole`` bytes before appending.
- any other bad line (one followed by a good line, or a whole bad line with no zero byte at the end) is damage to
  acknowledged data: ``CorruptFile`` names the file, the line and its byte position, and the broker refuses to start
  rather than serve a state with a hole in it.
What no check can tell from a tear: damage to the file's very last newline (the last line then reads as torn).
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any, NamedTuple

from .errors import CorruptFile

FORMAT_PREFIX = b"v1 "
_V1 = re.compile(rb"^v1 ([0-9a-f]{8}) (.*)\n$", re.DOTALL)


def encode(value: Any) -> bytes:
    """One line of format 1 for ``value`` (compact JSON)."""
    text = json.dumps(value, separators=(",", ":")).encode()
    return b"%s%08x %s\n" % (FORMAT_PREFIX, zlib.crc32(text), text)


def decode(line: bytes) -> Any:
    """The value of one whole line (ending in its newline); ValueError when it fails its check or does not parse."""
    if line.startswith(b"["):            # format 0: JSON alone, no check
        return json.loads(line)
    match = _V1.match(line)
    if match is None:
        raise ValueError("not a line of format 0 or 1")
    text = match.group(2)
    if zlib.crc32(text) != int(match.group(1), 16):
        raise ValueError("CRC mismatch")
    return json.loads(text)


class Loaded(NamedTuple):
    values: list[Any]      # every good line's value, in file order
    whole: int             # bytes of the file up to the end of its last good line; -1 when there is no file


def read(path: str) -> Loaded:
    """Every good line of the file at ``path``; raises CorruptFile for a bad line that is damage, not a tear."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return Loaded([], -1)
    values: list[Any] = []
    whole = pos = 0
    first_bad: tuple[int, int, str] | None = None   # (line number, byte position, why) of the first bad line
    # The first bad line with no zero byte. A tear leaves zeros in every line it touched and the lines it did not
    # touch intact, so each bad line must hold a zero of its own: one torn line's zeros excuse no other line.
    not_torn: tuple[int, int, str] | None = None
    with f:
        for number, line in enumerate(f, 1):
            start, pos = pos, pos + len(line)
            if not line.endswith(b"\n"):
                break                     # torn: the file's last line, never acknowledged
            try:
                value = decode(line)
            except (ValueError, RecursionError) as e:
                if first_bad is None:
                    first_bad = (number, start, str(e))
                if not_torn is None and b"\0" not in line:
                    not_torn = (number, start, str(e))
                continue
            if first_bad is not None:
                number_bad, start_bad, why = first_bad
                raise CorruptFile(f"{path}: line {number_bad} (byte {start_bad}) is damaged ({why}) and good lines "
                                  "follow it: acknowledged data was lost; restore the file or cut it at that byte",
                                  path=path, line=number_bad, position=start_bad)
            values.append(value)
            whole = pos
        if not_torn is not None:
            number_bad, start_bad, why = not_torn
            raise CorruptFile(f"{path}: line {number_bad} (byte {start_bad}) is damaged ({why}) and is no torn write "
                              "(whole, no zero bytes): acknowledged data was lost; restore the file or cut it at that "
                              "byte", path=path, line=number_bad, position=start_bad)
    return Loaded(values, whole)
