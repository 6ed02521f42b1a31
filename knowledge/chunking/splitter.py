"""Token-aware chunking with overlap that follows Markdown headings and handles
Chinese text.

A document is cut into sections at its headings (``#`` to ``######``); a chunk never
spans two sections, and each chunk's text starts with its heading path so that it
reads (and embeds) in context. Within a section, paragraphs are packed into chunks of
at most ``max_tokens`` tokens of the embedder's tokenizer; a paragraph too long for one
chunk is cut at sentence ends (``.!?`` and the CJK ``。！？；``), and a sentence too long
is cut at whitespace, or between characters for text without spaces (Chinese): never
inside a character. Each new chunk in a section starts with up to ``overlap_tokens``
of the previous chunk's end.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from knowledge.models import Chunk, Document

__all__ = ["Chunker", "TokenCounter"]

TokenCounter = Callable[[str], int]
"""Tokens of a text in the embedder's tokenizer (without special tokens)."""

_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_SENTENCE_END = re.compile(r"(?<=[.!?。！？；;])\s*|(?<=\n)")


@dataclass(frozen=True, slots=True)
class _Section:
    path: tuple[str, ...]
    body: str


def _sections(document: Document) -> list[_Section]:
    if document.format != "markdown":
        return [_Section((document.title,) if document.title else (), document.text)]
    sections: list[_Section] = []
    path: list[tuple[int, str]] = []
    lines: list[str] = []
    fenced = False

    def close() -> None:
        body = "\n".join(lines).strip()
        if body:
            sections.append(_Section(tuple(title for _, title in path), body))
        lines.clear()

    for line in document.text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        match = None if fenced else _HEADING.match(line)
        if match:
            close()
            level = len(match.group(1))
            path = [(lvl, title) for lvl, title in path if lvl < level]
            path.append((level, match.group(2)))
        else:
            lines.append(line)
    close()
    if not sections and document.text.strip():
        sections.append(_Section((), document.text.strip()))
    return sections


class Chunker:
    """Cuts documents into `Chunk` values.

    Args:
        count_tokens: the embedder's token counter.
        max_tokens: a chunk's size limit, heading path included.
        overlap_tokens: tokens of a chunk's end repeated at the start of the next one
            in the same section.
    """

    def __init__(self, count_tokens: TokenCounter, *, max_tokens: int = 200, overlap_tokens: int = 40) -> None:
        if overlap_tokens >= max_tokens // 2:
            raise ValueError(f"overlap_tokens ({overlap_tokens}) must be under half of max_tokens ({max_tokens})")
        self._count = count_tokens
        self.max_tokens = max_tokens
        self.overlap_tokens = overlap_tokens

    def split(self, document: Document) -> list[Chunk]:
        chunks: list[Chunk] = []
        for section in _sections(document):
            heading = " > ".join(section.path)
            prefix = f"{heading}\n\n" if heading else ""
            budget = max(self.max_tokens - self._count(prefix), self.max_tokens // 2)
            for body in self._pack(self._units(section.body, budget), budget):
                chunks.append(
                    Chunk(
                        doc_id=document.id,
                        index=len(chunks),
                        text=prefix + body,
                        heading=heading,
                        tokens=self._count(prefix + body),
                    )
                )
        return chunks

    # ---- units: paragraphs, or pieces of them that fit ------------------------------

    def _units(self, body: str, budget: int) -> list[tuple[str, int]]:
        units: list[tuple[str, int]] = []
        for paragraph in re.split(r"\n\s*\n", body):
            paragraph = paragraph.strip()
            if not paragraph:
                continue
            tokens = self._count(paragraph)
            if tokens <= budget:
                units.append((paragraph, tokens))
                continue
            for sentence in _SENTENCE_END.split(paragraph):
                sentence = sentence.strip()
                if not sentence:
                    continue
                tokens = self._count(sentence)
                if tokens <= budget:
                    units.append((sentence, tokens))
                else:
                    units.extend(self._hard_cut(sentence, budget))
        return units

    def _hard_cut(self, text: str, budget: int) -> list[tuple[str, int]]:
        """Pieces of at most ``budget`` tokens, cut at whitespace where there is some
        near the limit, else between characters."""
        pieces: list[tuple[str, int]] = []
        rest = text
        while rest:
            if (tokens := self._count(rest)) <= budget:
                pieces.append((rest, tokens))
                break
            # The longest prefix that fits, by bisection on characters.
            low, high = 1, len(rest)
            while low < high:
                middle = (low + high + 1) // 2
                if self._count(rest[:middle]) <= budget:
                    low = middle
                else:
                    high = middle - 1
            cut = low
            space = rest.rfind(" ", 0, cut)
            if space > cut * 0.6:
                cut = space
            piece = rest[:cut].strip()
            pieces.append((piece, self._count(piece)))
            rest = rest[cut:].strip()
        return pieces

    # ---- packing units into chunks, with overlap ---------------------------------------

    def _pack(self, units: list[tuple[str, int]], budget: int) -> list[str]:
        bodies: list[str] = []
        current: list[tuple[str, int]] = []
        size = 0
        for text, tokens in units:
            if current and size + tokens > budget:
                bodies.append(_join(current))
                current = self._overlap(current, budget - tokens)
                size = sum(t for _, t in current)
            current.append((text, tokens))
            size += tokens
        if current:
            bodies.append(_join(current))
        return bodies

    def _overlap(self, previous: list[tuple[str, int]], room: int) -> list[tuple[str, int]]:
        """The end of the previous chunk to repeat: whole units while they fit in the
        overlap, else the tail of the last unit."""
        allowance = min(self.overlap_tokens, room)
        if allowance <= 0:
            return []
        carried: list[tuple[str, int]] = []
        total = 0
        for text, tokens in reversed(previous):
            if total + tokens > allowance:
                break
            carried.insert(0, (text, tokens))
            total += tokens
        if carried:
            return carried
        last = previous[-1][0]
        start = len(last)
        # Grow the tail from the end, by characters, while it fits the allowance.
        step = max(1, len(last) // 50)
        while start - step > 0 and self._count(last[start - step :]) <= allowance:
            start -= step
        tail = last[start:]
        if " " in tail and not tail.startswith(" "):
            tail = tail[tail.index(" ") + 1 :]  # do not start in the middle of a word
        tail = tail.strip()
        return [(tail, self._count(tail))] if tail else []


def _join(units: list[tuple[str, int]]) -> str:
    return "\n\n".join(text for text, _ in units)
