"""Durations and instants, parsed with pendulum; internal times are UTC microseconds."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pendulum

from streamjoin.errors import JobError

_UNITS = {
    "us": "microseconds",
    "microsecond": "microseconds",
    "microseconds": "microseconds",
    "ms": "milliseconds",
    "millisecond": "milliseconds",
    "milliseconds": "milliseconds",
    "s": "seconds",
    "sec": "seconds",
    "second": "seconds",
    "seconds": "seconds",
    "m": "minutes",
    "min": "minutes",
    "minute": "minutes",
    "minutes": "minutes",
    "h": "hours",
    "hour": "hours",
    "hours": "hours",
    "d": "days",
    "day": "days",
    "days": "days",
}
_PART = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*")


def parse_duration(text: str | int | float, what: str = "duration") -> timedelta:
    """Parse `15s`, `1 HOURS`, `-4h`, `1h30m` or ISO 8601 (`PT1H`) into a timedelta."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return timedelta(seconds=text)
    raw = str(text).strip()
    if raw.upper().lstrip("-").startswith("P"):
        negative = raw.startswith("-")
        try:
            parsed = pendulum.parse(raw.lstrip("-"))
        except Exception as exc:  # pendulum raises several parser errors
            raise JobError(f"{what} {raw!r} is not a valid ISO 8601 duration: {exc}") from None
        if not isinstance(parsed, pendulum.Duration):
            raise JobError(f"{what} {raw!r} is not a duration; write e.g. '15s', '1h' or 'PT1H'")
        total = timedelta(seconds=parsed.total_seconds())
        return -total if negative else total
    pos, total = 0, timedelta()
    sign = -1 if raw.startswith("-") else 1
    body = raw[1:] if sign < 0 else raw
    while pos < len(body):
        match = _PART.match(body, pos)
        unit = _UNITS.get(match.group(2).lower()) if match else None
        if not match or unit is None or match.group(1).startswith("-"):
            raise JobError(
                f"{what} {raw!r} is not a duration; write a number and a unit "
                "(us, ms, s, m, h, d, or words like '1 HOURS'), e.g. '15s', '1h30m', or ISO 'PT1H'"
            )
        total += timedelta(**{unit: float(match.group(1))})
        pos = match.end()
    if not body:
        raise JobError(f"{what} is empty; write e.g. '15s' or '1h'")
    return sign * total


Instant = datetime | str  # a datetime, or an ISO date or datetime (no zone: UTC)


def parse_instant(text: Instant, what: str = "time") -> datetime:
    """Parse an ISO date or datetime (with or without zone; none means UTC) into a UTC datetime."""
    if isinstance(text, datetime):
        value = pendulum.instance(text)
    else:
        try:
            parsed = pendulum.parse(str(text), tz="UTC", exact=True)  # a bare time is not today's
        except Exception as exc:
            raise JobError(f"{what} {text!r} is not an ISO date or datetime: {exc}") from None
        if isinstance(parsed, pendulum.Date) and not isinstance(parsed, pendulum.DateTime):
            parsed = pendulum.datetime(parsed.year, parsed.month, parsed.day, tz="UTC")
        if not isinstance(parsed, pendulum.DateTime):
            raise JobError(
                f"{what} {text!r} is not a date or datetime, e.g. 2024-05-01 or 2024-05-01T12:00+02:00"
            )
        value = parsed
    return value.in_timezone("UTC")


def to_micros(value: datetime | timedelta) -> int:
    """Microseconds since the epoch (for a datetime) or in total (for a timedelta)."""
    if isinstance(value, timedelta):
        return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    return to_micros(value - pendulum.datetime(1970, 1, 1, tz="UTC"))


# The watermark of an input that has ended (Flink's final watermark): every window is closed.
# Also a margin that reaches that far: a replay reads the whole stream.
END_OF_INPUT = 2**62
# The instants a datetime holds, as UTC micros: a time range reaching beyond them (a ROWS
# window's margins, "the whole stream") is cut to them.
EARLIEST = to_micros(pendulum.datetime(1, 1, 2, tz="UTC"))
LATEST = to_micros(pendulum.datetime(9999, 12, 30, tz="UTC"))


def from_spark(value: datetime) -> datetime:
    """A timestamp collected from Spark (naive, in this process's local time) as an aware UTC datetime."""
    return (
        pendulum.instance(value.astimezone(UTC))
        if value.tzinfo is None
        else pendulum.instance(value).in_timezone("UTC")
    )


def from_micros(micros: int) -> datetime:
    """The UTC datetime `micros` microseconds after the epoch."""
    return pendulum.datetime(1970, 1, 1, tz="UTC") + timedelta(microseconds=micros)


def format_duration(value: timedelta) -> str:
    """A short human form: 1h30m, 15s, -4h."""
    micros = to_micros(value)
    if micros == 0:
        return "0s"
    sign, micros = ("-" if micros < 0 else ""), abs(micros)
    parts = []
    for unit, size in (
        ("d", 86_400_000_000),
        ("h", 3_600_000_000),
        ("m", 60_000_000),
        ("s", 1_000_000),
        ("ms", 1000),
        ("us", 1),
    ):
        if micros >= size:
            parts.append(f"{micros // size}{unit}")
            micros %= size
    return sign + "".join(parts)
