"""What JSON a request may carry: values that can be stored and sent back."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["INT64", "json_problem"]

INT64 = 1 << 63


def json_problem(value: Any, path: str = "", *, stored: bool = False) -> str | None:
    """What in a JSON value cannot be sent back (an integer beyond 64 bits, a number
    that is not finite, a lone surrogate in a string or key), with where it is;
    ``None`` if nothing. With ``stored``, also what a database cannot keep (NUL
    characters: PostgreSQL's text and jsonb refuse them)."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError:
                return f"{where or 'body'}: text with a lone surrogate (not valid Unicode)"
            if stored and "\x00" in item:
                return f"{where or 'body'}: text with a NUL character"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{where or 'body'}: a number that is not finite ({item})"
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not -INT64 <= item < (1 << 64):
                return f"{where or 'body'}: integer out of the 64-bit range"
        elif isinstance(item, Mapping):
            for key, child in item.items():
                if isinstance(key, str):
                    try:
                        key.encode()
                    except UnicodeEncodeError:
                        return f"{where or 'body'}: a key with a lone surrogate (not valid Unicode)"
                    if stored and "\x00" in key:
                        return f"{where or 'body'}: a key with a NUL character"
                stack.append((child, f"{where}.{key}" if where else str(key)))
        elif hasattr(item, "model_fields_set"):  # a nested pydantic model
            stack.extend((getattr(item, name), f"{where}.{name}" if where else name) for name in item.model_fields_set)
        elif isinstance(item, (list, tuple)):
            stack.extend((child, f"{where}.{index}" if where else str(index)) for index, child in enumerate(item))
    return None
