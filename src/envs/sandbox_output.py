"""Bounded capture of a subprocess's output: keep its head and tail, cut the middle."""

from __future__ import annotations

import threading


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and tail of ``text`` (len <= max_chars plus a one-line marker)."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[len(text) - tail :]}"


class CappedReader(threading.Thread):
    """Drains a pipe, keeping at most ``cap`` bytes of its head and of its tail."""

    def __init__(self, stream, cap: int) -> None:
        super().__init__(daemon=True)
        self._stream, self._cap = stream, cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def run(self) -> None:
        while True:
            chunk = self._stream.read1(65536) if hasattr(self._stream, "read1") else self._stream.read(65536)
            if not chunk:
                return
            self.total += len(chunk)
            room = self._cap - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            if chunk:
                self.tail += chunk
                if len(self.tail) > self._cap:
                    del self.tail[: len(self.tail) - self._cap]


def assemble(head: str, tail: str, dropped_bytes: int, max_chars: int) -> tuple[str, bool]:
    """Join the kept head and tail into at most ``max_output_chars`` characters (plus a marker line)."""
    if dropped_bytes <= 0:  # nothing was dropped while reading: head + tail is the whole output
        text = head + tail
        return truncate_middle(text, max_chars), len(text) > max_chars
    # Both buffers are full (cap bytes >= max_output_chars characters), so the slices below are exact.
    half = max_chars // 2
    rest = max_chars - half
    cut = dropped_bytes + (len(head) - half) + (len(tail) - rest)
    return f"{head[:half]}\n[... about {cut} characters cut ...]\n{tail[len(tail) - rest :]}", True
