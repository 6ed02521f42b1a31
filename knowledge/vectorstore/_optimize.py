"""Optimise one Qdrant Edge shard in a process of its own: ``python _optimize.py PATH``.

`EdgeStore` runs this on a copy of a collection's shard. qdrant-edge-py's
``EdgeShard.optimize()`` holds the GIL until every segment is rebuilt (seconds at 10k
chunks, minutes at 100k), so inside the server it would stop every request. Here it
holds only this process, which also lowers its own CPU priority so the server's
requests come first on a small machine.

Prints one JSON line: ``{"optimized": bool, "seconds": float, "points": int,
"segments": int}``. Imports nothing of Switchyard, so it runs as a plain script.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: _optimize.py SHARD_DIR", file=sys.stderr)
        return 2
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
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
