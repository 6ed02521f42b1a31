"""Re-vendor the Kubernetes JSON schemas the manifests in deploy/k8s use.

Source: the ``kubernetes-validate`` wheel on PyPI (Apache-2.0), directory
``kubernetes-json-schema/v1.32.0-local-strict`` (strict: unknown fields are errors).
Only the kinds below are copied; ``_definitions.json`` is cut to the definitions they
reach through ``$ref`` (the rest of the 1.3 MB file describes kinds we do not use).

    pip download kubernetes-validate==1.37.0 --no-deps -d /tmp/kv
    unzip -q /tmp/kv/kubernetes_validate-1.37.0-py3-none-any.whl -d /tmp/kv/whl
    python deploy/schemas/kubernetes/vendor.py /tmp/kv/whl/kubernetes_validate/kubernetes-json-schema/v1.32.0-local-strict
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

KINDS = (
    "configmap-v1",
    "deployment-apps-v1",
    "horizontalpodautoscaler-autoscaling-v2",
    "persistentvolumeclaim-v1",
    "poddisruptionbudget-policy-v1",
    "service-v1",
    "serviceaccount-v1",
)
_PREFIXES = ("/api/_definitions.json#/$defs/", "#/$defs/")


def _refs(node: Any) -> set[str]:
    """Definition names a schema fragment points at."""
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        for prefix in _PREFIXES:
            if isinstance(ref, str) and ref.startswith(prefix):
                found.add(ref.removeprefix(prefix))
        for value in node.values():
            found |= _refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= _refs(value)
    return found


def main(source: Path, target: Path) -> None:
    definitions = json.loads((source / "_definitions.json").read_text())
    wanted: set[str] = set()
    queue: list[str] = []
    for kind in KINDS:
        schema = json.loads((source / f"{kind}.json").read_text())
        (target / f"{kind}.json").write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
        queue.extend(_refs(schema))
    while queue:
        name = queue.pop()
        if name in wanted:
            continue
        wanted.add(name)
        queue.extend(_refs(definitions["$defs"][name]))
    cut = {k: v for k, v in definitions.items() if k != "$defs"}
    cut["$defs"] = {name: definitions["$defs"][name] for name in sorted(wanted)}
    (target / "_definitions.json").write_text(json.dumps(cut, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).resolve().parent)
