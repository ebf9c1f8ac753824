"""What each source can serve, and the refusal of a range that starts earlier (streamjoin/reach.py).
The reasons per kind of source come from real tables in tests/test_real_history.py; here, the
decisions over them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from streamjoin.errors import JobError
from streamjoin.reach import NEVER, Reach, as_json, describe, earliest, refuse_before
from streamjoin.timeutil import to_micros


class _Plan:
    class spec:  # noqa: N801  # what refuse_before reads of a plan
        name = "attribution"


DAY = datetime(2026, 11, 10, tzinfo=UTC)
FOUND = [
    Reach("impressions", None, "row tracking: its newest snapshot holds every row with its commit"),
    Reach(
        "campaigns",
        to_micros(DAY),
        "the job's journal holds its changes since the job's start",
        "an earlier start",
        table=True,
    ),
    Reach("fx_rates", None, "an append-only changelog with row tracking", table=True),
    Reach(
        "clicks",
        to_micros(datetime(2026, 11, 12, tzinfo=UTC)),
        "change files kept 7 days",
        "turn on row tracking",
    ),
]


def test_the_job_serves_from_the_latest_of_its_sources():
    assert earliest(FOUND) == to_micros(datetime(2026, 11, 12, tzinfo=UTC))
    assert earliest([FOUND[0], FOUND[2]]) is None
    text = describe(FOUND)
    assert "impressions  from any time: row tracking" in text
    assert "the job can serve slices from 2026-11-12T00:00:00+00:00" in text
    assert as_json(FOUND)["sources"]["campaigns"]["from"] == "2026-11-10T00:00:00+00:00"
    assert describe([Reach("campaigns", NEVER, "gone")]).endswith("the job can serve slices from no time")


def test_a_range_starting_earlier_is_refused_naming_every_source_that_cannot_serve_it():
    refuse_before(FOUND, datetime(2026, 11, 12, tzinfo=UTC), _Plan)  # from the job's earliest: fine
    with pytest.raises(JobError) as refused:
        refuse_before(FOUND, datetime(2026, 11, 1, tzinfo=UTC), _Plan)
    text = str(refused.value)
    refusal = text.splitlines()[0]  # the table of every source follows it
    assert (
        "campaigns from 2026-11-10T00:00:00+00:00 (the job's journal" in text and "an earlier start" in text
    )
    assert "clicks from 2026-11-12" in text and "turn on row tracking" in text
    assert "impressions" not in refusal and "fx_rates" not in refusal
    assert (
        "Start the range at 2026-11-12T00:00:00+00:00 or later, or run it with --assume-earliest-known"
        in text
    )
    assert text.endswith(describe(FOUND))  # the whole table follows
    with pytest.raises(JobError, match="clicks from 2026-11-12") as refused:
        refuse_before(FOUND, datetime(2026, 11, 11, tzinfo=UTC), _Plan)
    refusal = str(refused.value).splitlines()[0]
    assert "campaigns from" not in refusal and "--assume-earliest-known" not in refusal
    # Assuming the tables' earliest known state stands in for tables only: a stream still refuses.
    with pytest.raises(JobError) as refused:
        refuse_before(FOUND, datetime(2026, 11, 1, tzinfo=UTC), _Plan, tables_assumed=True)
    assert "clicks from" in str(refused.value) and "campaigns from" not in str(refused.value).splitlines()[0]
    refuse_before(FOUND[:3], datetime(2026, 11, 1, tzinfo=UTC), _Plan, tables_assumed=True)
