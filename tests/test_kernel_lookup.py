"""Lookup joins decided at the kernel's level, against `reference.lateral_reference`, with a real
PostgreSQL on loopback and the journal on Delta.

Each example: a random customers table (several rows per id, or none), random orders in commits
(NULL customers and times rejected), INNER or LEFT, with or without a further condition on the
database row. A replay over random slices asks the database once per (commit, key) and writes
what the reference gives for that database; then the database changes at random, and the live
runner's `decide` over micro-batches that cut commits writes the same rows again, from the
journal, asking the database nothing.
"""

from __future__ import annotations

import os
import uuid

import pytest
from conftest import append
from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_harness import (
    DECIDED,
    SETTINGS,
    assert_one_stream_slices,
    at_random,
    one_stream_frame,
    one_stream_live,
)
from postgres import server
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StringType, StructField, StructType, TimestampType
from reference import lateral_reference

from streamjoin import arrival, delta_io, kernel
from streamjoin.joins.base import Write
from streamjoin.plan import bind
from streamjoin.spec import spec_from_dict

EXAMPLES = int(os.environ.get("STREAMJOIN_KERNEL_EXAMPLES", "5"))
ORDERS = StructType(
    [
        StructField("id", StringType()),
        StructField("customer", IntegerType()),
        StructField("t", TimestampType()),
    ]
)
COUNTRIES = st.sampled_from(["DE", "FR", "AT"])
CUSTOMERS = st.lists(st.tuples(st.integers(0, 5), COUNTRIES), max_size=10)  # (id, country); ids may repeat


@st.composite
def histories(draw):
    """Orders (id, customer, seconds) in commits: [(version, rows)], versions 1, 2, ..."""
    rows = draw(
        st.lists(
            st.tuples(st.none() | st.integers(0, 6), st.none() | st.integers(0, 200)), min_size=1, max_size=40
        )
    )
    commits, start, version = [], 0, 0
    while start < len(rows):
        size = draw(st.integers(1, 6))
        version += 1
        commits.append((version, [(f"{start + i}", *r) for i, r in enumerate(rows[start : start + size])]))
        start += size
    return commits


@pytest.fixture(scope="module")
def database(spark, tmp_path_factory):
    folder = tmp_path_factory.mktemp("kernel_lookup")
    append(spark, folder / "orders", [], ORDERS)
    with server() as running:
        running.sql("CREATE TABLE customers (id int, country text)")
        yield folder, running


def fill(server, customers) -> None:
    values = ", ".join(f"({i}, '{c}')" for i, c in customers)
    server.sql("DELETE FROM customers;" + (f" INSERT INTO customers VALUES {values};" if values else ""))


def made(customers, residual: bool):
    """What the database answers an order of `customer`, as the reference sees it."""
    return lambda customer: [(c,) for i, c in customers if i == customer and not (residual and c == "FR")]


def expected(commits, customers, how, residual, inside=lambda t: True):
    accepted = [
        (r[0], r[1], r[2]) for _, part in commits for r in part if r[1] is not None and r[2] is not None
    ]
    return lateral_reference([r for r in accepted if inside(r[2])], how, made(customers, residual), 1)


def plan_for(spark, folder, server, how, residual, output):
    on = "orders.customer = c.id" + (" AND c.country <> 'FR'" if residual else "")
    spec = spec_from_dict(
        {
            "name": "lookup",
            "sources": {"orders": {"path": str(folder / "orders"), "time": "t"}},
            "from": "orders",
            "joins": [
                {"lookup": {"url": server.url, "table": "customers"}, "as": "c", "on": on, "type": how}
            ],
            "select": ["orders.id", "c.country"],
            "output": {"path": str(folder / output)},
        }
    )
    return bind(spark, spec)


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(
    how=st.sampled_from(("inner", "left")),
    residual=st.booleans(),
    before=CUSTOMERS,
    after=CUSTOMERS,
    commits=at_random(histories()),
    cuts=st.lists(st.integers(0, 200), max_size=2).map(sorted),
    data=st.data(),
)
def test_replays_ask_once_and_live_batches_read_the_journal(
    spark, database, how, residual, before, after, commits, cuts, data
):
    folder, server = database
    plan = plan_for(spark, folder, server, how, residual, f"out_{data.draw(st.uuids()).hex}")
    fill(server, before)
    frame = one_stream_frame(spark, plan, commits)
    result = assert_one_stream_slices(
        spark, plan, frame, cuts, lambda a, b: expected(commits, before, how, residual, lambda t: a <= t < b)
    )
    asked = {(v, r[1]) for v, part in commits for r in part if r[1] is not None and r[2] is not None}
    assert result.total("lookups") == len(asked)

    fill(server, after)  # the database moves on; the journal holds what it said
    total = sum(len(part) for _, part in commits)
    ends = sorted(data.draw(st.sets(st.integers(1, total), max_size=3)) | {total})
    run = one_stream_live(spark, plan, frame, ends)
    rows, counts = expected(commits, before, how, residual)
    assert run.output == rows
    assert run.lookups == 0 and run.waiting == 0
    assert {b: run.counts[b] for b in DECIDED} == {b: counts[b] for b in DECIDED}
    rejected = sum(1 for _, part in commits for r in part if r[1] is None or r[2] is None)
    assert (run.counts["rows_in"], run.counts["rejected"]) == (total, rejected)


def test_a_step_asks_its_runner_to_record_the_answers_it_fetched(spark, database):
    """The journal is appended by the runner with the step's other writes (`Write.APPEND`), not by
    the step: the step records nothing itself, its rows use the answers it fetched (read once,
    whatever the database says later, and once only after the runner appended them), and the next
    step over the same commit finds them."""
    folder, server = database
    plan = plan_for(spark, folder, server, "left", False, f"out_{uuid.uuid4().hex}")
    fill(server, [(1, "DE"), (2, "FR")])
    frame = one_stream_frame(spark, plan, [(1, [("a", 2, 10)]), (2, [("b", 1, 20), ("c", 3, 30)])])
    accepted, _ = kernel.split_rejected(frame)

    def step(version: int) -> kernel.StepResult:
        settled = {"orders": accepted.where(F.col(arrival.V) == version)}
        return kernel.step(spark, plan, kernel.StepInput(settled, arrival.Timeline({}, None), "exact"))

    def written(result: kernel.StepResult) -> list[tuple]:
        """The rows, read by a new query each time (as a runner's count and write are)."""
        return sorted((r["id"], r["country"] or "") for r in result.output.select("id", "country").collect())

    journal = plan.spec.output.side("lookups")
    assert kernel.append_writes(step(1)) == [journal]  # the journal holds commit 1's answer from here on
    result = step(2)
    assert delta_io.read_snapshot(spark, journal).count() == 1
    (write,) = result.writes
    assert (write.how, write.location, result.total("lookups")) == (Write.APPEND, journal, 2)
    fill(server, [(1, "AT")])  # the database moves on
    rows = [("b", "DE"), ("c", "")]
    assert written(result) == rows
    assert kernel.append_writes(result) == [journal]
    assert written(result) == rows
    again = step(2)
    assert (again.writes, again.total("lookups")) == ([], 0)
    assert written(again) == rows
