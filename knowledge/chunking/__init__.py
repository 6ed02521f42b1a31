"""Cutting documents into chunks: token-aware, with overlap, along Markdown headings."""

from knowledge.chunking.splitter import Chunker, TokenCounter

__all__ = ["Chunker", "TokenCounter"]
