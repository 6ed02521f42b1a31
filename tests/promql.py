"""Reading Prometheus text exposition in tests (Switchyard's and llama.cpp's)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx

from gateway import Backend

_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? ([0-9.eE+-]+|NaN|[+-]Inf)$")


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


def metric(url: str, name: str, **labels: str) -> float:
    """`sample` of ``url/metrics`` (``url``: a server root)."""
    return sample(httpx.get(url + "/metrics", timeout=5).text, name, **labels)


def wait_for(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``predicate`` every 0.1 s; True as soon as it holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def backend_idle(backend: Backend, within_s: float = 5) -> bool:
    """The llama.cpp backend has no request generating (within ``within_s``)."""
    return wait_for(lambda: metric(backend.root_url, "llamacpp:requests_processing") == 0, within_s)
