"""The run registry keeps a bounded number of finished runs, oldest out first, and
forgets stateless runs once they end (nothing can address them)."""

from __future__ import annotations

from serving.runs import RunRecord, RunRegistry


def _record(n: int, thread: str | None = "t") -> RunRecord:
    return RunRecord(f"r{n}", thread, "chat", "tenant", "reject", {})


async def test_finished_runs_are_bounded_oldest_first() -> None:
    registry = RunRegistry(max_finished=3)
    records = [_record(n, thread=f"t{n}") for n in range(6)]
    for record in records:
        registry.add(record)
        registry.ended(record)
        record.finish("success")
    registry.add(_record(99, thread="t99"))  # pruning happens as runs are added
    kept = [n for n in range(6) if registry.get(f"r{n}", "tenant") is not None]
    assert kept == [3, 4, 5]
    assert registry.get("r99", "tenant") is not None  # running: never pruned
    assert registry.active("t99") is not None and registry.active("t5") is None


async def test_expired_runs_are_dropped() -> None:
    registry = RunRegistry(retention_s=60.0)
    old = _record(1)
    registry.add(old)
    registry.ended(old)
    old.finish("success")
    assert old.ended_at is not None
    old.ended_at -= 61.0
    registry.add(_record(2, thread="u"))
    assert registry.get("r1", "tenant") is None


async def test_stateless_runs_are_forgotten_when_they_end() -> None:
    registry = RunRegistry()
    run = _record(1, thread=None)
    registry.add(run)
    assert registry.get("r1", "tenant") is run
    registry.ended(run)
    assert registry.get("r1", "tenant") is None


async def _drain(record: RunRecord, after: int = -1) -> list[str]:
    return [frame async for frame in record.follow(after)]


async def test_a_runs_kept_frames_are_bounded_and_resume_says_what_was_dropped() -> None:
    record = _record(1)
    record.frames, record.replay_bytes = [], 100
    frames = [f"event: values\ndata: {n:04d}\nid: {n}\n\n" for n in range(20)]  # 33 bytes each
    for frame in frames:
        record.append(frame)
    record.finish("success")
    assert record.frames_bytes <= 100 and record.dropped == 17
    assert await _drain(record, after=17) == frames[18:]
    resumed = await _drain(record, after=2)
    assert resumed[0] == ": 14 earlier events are no longer kept\n\n" and resumed[1:] == frames[17:]
    assert await _drain(record, after=99) == []


async def test_finished_runs_frames_are_bounded_in_all() -> None:
    registry = RunRegistry(finished_replay_bytes=270)
    records = [_record(n, thread=f"t{n}") for n in range(5)]
    for record in records:
        registry.add(record)
        record.frames = []
        for n in range(3):
            record.append(f"event: values\ndata: {n}\nid: {n}\n\n")  # 29 bytes each: three runs fit
        registry.ended(record)
        record.finish("success")
    kept = [len(r.frames or []) for r in records]
    assert kept == [0, 0, 3, 3, 3]  # the oldest finished runs lost their frames first
    assert await _drain(records[0]) == [": 3 earlier events are no longer kept\n\n"]
