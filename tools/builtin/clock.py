"""``current_time``: the date and time now, in a time zone."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, Field

from tools.base import Tool, ToolContext

__all__ = ["current_time"]


class TimeArgs(BaseModel):
    timezone: str = Field(default="UTC", max_length=64, description="An IANA time zone, e.g. Europe/Paris")


async def _run(args: TimeArgs, context: ToolContext) -> str:  # type: ignore[override]
    try:
        zone = UTC if args.timezone.upper() == "UTC" else ZoneInfo(args.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {args.timezone!r}") from None
    return datetime.now(zone).isoformat(timespec="seconds")


current_time = Tool(
    name="current_time",
    description="The current date and time (ISO 8601) in a time zone.",
    args_schema=TimeArgs,
    run=_run,  # type: ignore[arg-type]
    timeout_s=2.0,
    idempotent=True,
    examples=('User: What time is it in Tokyo? -> current_time({"timezone": "Asia/Tokyo"})',),
)
