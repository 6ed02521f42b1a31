"""Optimise one Qdrant Edge shard in a process of its own:
``python _optimize.py PATH PARENT_PID``.

`EdgeStore` runs this on a copy of a collection's shard. qdrant-edge-py's
``EdgeShard.optimize()`` holds the GIL until every segment is rebuilt (seconds at 10k
chunks, minutes at 100k), so inside the server it would stop every request. Here it
holds only this process, which also lowers its own CPU priority so the server's
requests come first on a small machine.

It dies with its parent (a killed server leaves no optimiser behind), and syncs every
file and directory of the shard to disk before it reports success, since the caller
then swaps this copy in and deletes the old shard.

Prints one JSON line: ``{"optimized": bool, "seconds": float, "points": int,
"segments": int}``. Imports nothing of Switchyard, so it runs as a plain script.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the parent kills it on close
    if os.getppid() != parent:
        sys.exit(3)  # the parent died before the signal was set


def _sync_tree(root: Path) -> None:
    for directory, _, files in os.walk(root):
        for name in files:
            descriptor = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: _optimize.py SHARD_DIR PARENT_PID", file=sys.stderr)
        return 2
    _die_with(int(argv[2]))
    try:
        os.nice(10)
    except OSError:
        pass  # not permitted here: run at normal priority
    from qdrant_edge import EdgeShard

    started = time.perf_counter()
    shard = EdgeShard.load(argv[1])
    try:
        changed = shard.optimize()
        shard.flush()
        info = shard.info()
        result = {
            "optimized": bool(changed),
            "seconds": round(time.perf_counter() - started, 3),
            "points": info.points_count,
            "segments": info.segments_count,
        }
    finally:
        shard.close()
    _sync_tree(Path(argv[1]))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
