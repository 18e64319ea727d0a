"""File contents read at a commit, kept by blob sha in a bounded least-recently-used cache.

A blob sha names its content for good, so a cached text never goes stale; the cache is bounded
by total characters, not entries, since one generated file can outweigh a thousand small ones.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# Files larger than this are not read for context (generated, vendored or data files).
MAX_FILE_BYTES = 512 * 1024
DEFAULT_CACHE_CHARS = 32 * 1024 * 1024


@dataclass(slots=True)
class BlobCache:
    """Texts by blob sha, the least recently used dropped past `max_chars` in all."""

    max_chars: int = DEFAULT_CACHE_CHARS
    _texts: OrderedDict[str, str] = field(default_factory=OrderedDict)
    _chars: int = 0
    hits: int = 0
    misses: int = 0

    def get(self, blob_sha: str | None) -> str | None:
        """The cached text of a blob, or None (counted as a hit or a miss)."""
        if blob_sha is None or blob_sha not in self._texts:
            self.misses += 1
            return None
        self._texts.move_to_end(blob_sha)
        self.hits += 1
        return self._texts[blob_sha]

    def put(self, blob_sha: str, text: str) -> None:
        """Keep a blob's text (one larger than the whole cache is not kept)."""
        if len(text) > self.max_chars:
            return
        if blob_sha in self._texts:
            self._texts.move_to_end(blob_sha)
            return
        self._texts[blob_sha] = text
        self._chars += len(text)
        while self._chars > self.max_chars:
            _, dropped = self._texts.popitem(last=False)
            self._chars -= len(dropped)

    def __len__(self) -> int:
        return len(self._texts)

    def split(
        self, paths: Sequence[str], blob_of: Callable[[str], str | None]
    ) -> tuple[dict[str, str | None], list[str]]:
        """The texts of `paths` whose blob (`blob_of(path)`) is cached, and the paths still to
        read, in order."""
        texts: dict[str, str | None] = {}
        wanted: list[str] = []
        for path in paths:
            cached = self.get(blob_of(path))
            if cached is not None:
                texts[path] = cached
            else:
                wanted.append(path)
        return texts, wanted


def decode_text(data: bytes) -> str | None:
    """A file's bytes as text; None for a binary file, one too large, or one not UTF-8."""
    if len(data) > MAX_FILE_BYTES or b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


__all__ = ["MAX_FILE_BYTES", "BlobCache", "decode_text"]
