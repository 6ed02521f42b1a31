"""BM25-style sparse vectors that work for English and Chinese.

Terms: lower-cased words of letters and digits (English stop words dropped), and, for
runs of CJK characters (which have no spaces), each character and each pair of
neighbouring characters: the usual way to index Chinese without a word segmenter.
Each term is hashed to a stable 31-bit index. A document's value for a term is BM25's
saturated term frequency; the inverse document frequency is applied by Qdrant at query
time (the sparse vector is declared with ``modifier: idf``), so adding documents never
requires re-encoding the others. A query's vector has 1.0 for each of its terms.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter

__all__ = ["SparseEncoder", "SparseVector", "terms"]

SparseVector = tuple[list[int], list[float]]
"""``(indices, values)``, indices ascending and unique."""

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af"
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+", re.UNICODE)
_CJK_RUN = re.compile(rf"^[{_CJK}]+$")
_STOP = frozenset(
    "a an and are as at be but by for from has have he her his i if in into is it its of on or our she so "
    "that the their them they this to was we were what when where which who why will with you your".split()
)


def terms(text: str) -> list[str]:
    """The index terms of a text, in order, with repeats."""
    out: list[str] = []
    for token in _TOKEN.findall(text.lower()):
        if _CJK_RUN.match(token):
            out.extend(token)
            out.extend(token[i : i + 2] for i in range(len(token) - 1))
        elif token not in _STOP:
            out.append(token)
    return out


def _index(term: str) -> int:
    return int.from_bytes(hashlib.blake2b(term.encode(), digest_size=4).digest(), "big") & 0x7FFFFFFF


class SparseEncoder:
    """Documents and queries to sparse vectors.

    Args:
        k1: BM25's term-frequency saturation.
        b: BM25's length normalisation.
        average_terms: the typical chunk length in terms (chunks are cut to a token
            budget, so lengths vary little).
    """

    def __init__(self, *, k1: float = 1.2, b: float = 0.75, average_terms: float = 150.0) -> None:
        self.k1, self.b, self.average_terms = k1, b, average_terms

    def document(self, text: str) -> SparseVector:
        found = terms(text)
        counts = Counter(_index(t) for t in found)
        norm = self.k1 * (1 - self.b + self.b * len(found) / self.average_terms)
        indices = sorted(counts)
        return indices, [counts[i] * (self.k1 + 1) / (counts[i] + norm) for i in indices]

    def query(self, text: str) -> SparseVector:
        indices = sorted({_index(t) for t in terms(text)})
        return indices, [1.0] * len(indices)
