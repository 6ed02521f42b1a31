"""Chunking: sizes in the embedder's tokens, Markdown headings, overlap, Chinese."""

from __future__ import annotations

import re

import pytest

from knowledge.chunking import Chunker
from knowledge.embeddings.local import LocalEmbedder
from knowledge.models import Document

from tests.knowledge.conftest import CORPUS


@pytest.fixture(scope="module")
def chunker(embedder: LocalEmbedder) -> Chunker:
    return Chunker(embedder.count_tokens, max_tokens=60, overlap_tokens=12)


def test_chunks_follow_headings_and_carry_their_path(chunker: Chunker) -> None:
    text = "# Guide\n\nIntro text.\n\n## Setup\n\nInstall it.\n\n```\n# not a heading\n```\n\n### Linux\n\nUse apt.\n\n## Use\n\nRun it."
    chunks = chunker.split(Document(id="g.md", text=text, format="markdown"))
    assert [c.heading for c in chunks] == ["Guide", "Guide > Setup", "Guide > Setup > Linux", "Guide > Use"]
    assert chunks[1].text.startswith("Guide > Setup\n\n") and "# not a heading" in chunks[1].text
    assert [c.index for c in chunks] == [0, 1, 2, 3]
    assert chunks[3].chunk_id == "g.md#3"


def test_long_sections_are_cut_to_size_with_overlap(chunker: Chunker, embedder: LocalEmbedder) -> None:
    sentences = [f"Sentence number {i} talks about the tram line {i} and its {i * 3} stops." for i in range(40)]
    chunks = chunker.split(Document(id="t.txt", text=" ".join(sentences)))
    assert len(chunks) > 3
    assert all(c.tokens <= 60 + 4 for c in chunks)  # separators may add a token or two
    joined = " ".join(c.text for c in chunks)
    assert all(s in joined for s in sentences)  # nothing lost
    for before, after in zip(chunks, chunks[1:], strict=False):
        overlap = after.text.split("\n\n")[0]
        assert before.text.endswith(overlap) and len(overlap) > 10  # starts with the end of the one before
        assert len(re.findall(r"Sentence number \d+", after.text)) >= 1


def test_chinese_text_is_cut_between_characters_into_sensible_sizes(chunker: Chunker, embedder: LocalEmbedder) -> None:
    text = (CORPUS / "13-wuling-tea-cooperative.md").read_text()
    chunks = chunker.split(Document(id="zh.md", text=text, format="markdown"))
    body = "".join(text.split())
    for chunk in chunks:
        piece = chunk.text.split("\n\n", 1)[-1]
        for part in piece.split("\n\n"):
            assert "".join(part.split()) in body  # every piece is a run of the original text
        assert 8 <= chunk.tokens <= 64
    no_spaces = "这是一段没有任何空格也没有标点符号的很长很长的中文文本" * 12
    hard = chunker.split(Document(id="long.txt", text=no_spaces))
    assert len(hard) > 1 and all(c.tokens <= 60 for c in hard)
    assert "".join(c.text for c in hard).count("这") >= no_spaces.count("这")


def test_overlap_must_be_under_half_the_size(embedder: LocalEmbedder) -> None:
    with pytest.raises(ValueError, match="overlap_tokens"):
        Chunker(embedder.count_tokens, max_tokens=100, overlap_tokens=60)
