"""The demo: a day of orders, payments, shipments, customers and currency rates as local Delta tables,
the demo jobs of jobs/ run live and replayed in both modes, and a summary that adds up.
"""

from __future__ import annotations

import functools
import random
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, StringType, StructField, StructType, TimestampType

from streamjoin import delta_io
from streamjoin.arrival import Slice
from streamjoin.errors import JobError
from streamjoin.frames import local_frame
from streamjoin.jobfile import job_files, load_job
from streamjoin.metrics import RunMetrics, combine
from streamjoin.plan import bind
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay_slices
from streamjoin.session import PROJECT_ROOT, get_spark
from streamjoin.spec import JoinSpec

DAY = datetime(2024, 5, 1)
JOBS_DIR = PROJECT_ROOT / "jobs"  # the demo's job files: the demo runs from a source checkout
RUNNABLE = ("orders_payments", "payments_shipments", "orders_rates", "orders_fulfilment")

ORDERS = StructType(
    [
        StructField("order_id", StringType()),
        StructField("customer_id", StringType()),
        StructField("currency", StringType()),
        StructField("amount", DoubleType()),
        StructField("order_time", TimestampType()),
    ]
)
PAYMENTS = StructType(
    [
        StructField("payment_id", StringType()),
        StructField("order_id", StringType()),
        StructField("amount", DoubleType()),
        StructField("paid_at", TimestampType()),
    ]
)
SHIPMENTS = StructType(
    [
        StructField("shipment_id", StringType()),
        StructField("order_id", StringType()),
        StructField("carrier", StringType()),
        StructField("shipped_at", TimestampType()),
    ]
)
CUSTOMERS = StructType(
    [
        StructField("customer_id", StringType()),
        StructField("name", StringType()),
        StructField("country", StringType()),
        StructField("updated_at", TimestampType()),
    ]
)
RATES = StructType(
    [
        StructField("currency", StringType()),
        StructField("rate", DoubleType()),
        StructField("valid_from", TimestampType()),
    ]
)


@dataclass(frozen=True)
class Commit:
    """One Delta commit of the demo: rows appended to a stream, or merged into a table by `key`."""

    table: str
    schema: StructType
    rows: list[tuple]
    key: tuple[str, ...] = ()


@dataclass
class DemoData:
    """Rows per table, each table's rows grouped into the commits that will deliver them."""

    commits: list[Commit]
    tables: dict[str, tuple[StructType, list[tuple]]]


def generate(seed: int = 7, orders: int = 120, blocks: int = 12) -> DemoData:
    """A day of events. Arrival comes in `blocks` rounds; a few payments arrive hours late, a few
    carry no order id, some orders are never paid and some payments come after the 1-hour window.
    Currency rates change once per round (merged in place, valid from a few minutes into it), and
    one round's rates arrive a round late."""
    rng = random.Random(seed)
    customers = [f"c{i:03d}" for i in range(20)]
    streams = _events(rng, orders, blocks, customers)
    rate_rounds = _rate_rounds(rng, blocks)
    schemas = {"orders": ORDERS, "payments": PAYMENTS, "shipments": SHIPMENTS}
    commits = []
    for block in range(blocks):
        for rows in rate_rounds.get(block, []):
            commits.append(Commit("currency_rates", RATES, rows, key=("currency",)))
        for table in ("orders", "payments", "shipments"):
            delivered = streams[table].get(block)
            if delivered:
                commits.append(Commit(table, schemas[table], delivered))
    tables: dict[str, tuple[StructType, list[tuple]]] = {
        "customers": (
            CUSTOMERS,
            [(c, f"Customer {c}", rng.choice(["NL", "DE", "FR"]), DAY) for c in customers],
        ),
        "currency_rates": (RATES, [("EUR", 1.0, DAY), ("USD", 0.92, DAY), ("GBP", 1.17, DAY)]),
    }
    return DemoData(commits, tables)


def _events(
    rng: random.Random, orders: int, blocks: int, customers: list[str]
) -> dict[str, dict[int, list[tuple]]]:
    """The streams' rows by the round they arrive in: orders, their payments (a few hours late,
    a few without an order id) and shipments."""
    block_of = lambda t: min(int((t - DAY).total_seconds() // (86_400 / blocks)), blocks - 1)  # noqa: E731
    streams: dict[str, dict[int, list[tuple]]] = {"orders": {}, "payments": {}, "shipments": {}}

    def deliver(table: str, block: int, row: tuple) -> None:
        streams[table].setdefault(block, []).append(row)

    for n in range(orders):
        order_time = DAY + timedelta(seconds=rng.randrange(0, 86_400 - 4 * 3600))
        order_id = f"o{n:04d}"
        amount = round(rng.uniform(5, 500), 2)
        deliver(
            "orders",
            block_of(order_time),
            (order_id, rng.choice(customers), rng.choice(["EUR", "USD", "GBP"]), amount, order_time),
        )
        if rng.random() < 0.85:
            paid_at = order_time + timedelta(minutes=rng.randrange(1, 75))
            late = rng.random() < 0.06
            block = min(block_of(paid_at) + (3 if late else 0), blocks - 1)
            deliver("payments", block, (f"p{n:04d}", order_id, amount, paid_at))
            if rng.random() < 0.8:
                shipped_at = paid_at + timedelta(minutes=rng.randrange(10, 150))
                deliver(
                    "shipments",
                    block_of(shipped_at),
                    (f"s{n:04d}", order_id, rng.choice(["DHL", "UPS", "PostNL"]), shipped_at),
                )
    for n in range(4):  # bad input: payments without an order id
        paid_at = DAY + timedelta(hours=3 + 5 * n)
        deliver("payments", block_of(paid_at), (f"px{n}", None, 10.0, paid_at))
    return streams


def _rate_rounds(rng: random.Random, blocks: int) -> dict[int, list[list[tuple]]]:
    """The currency rates' commits by round: new rates each round, valid from a few minutes into
    it; one round's are committed after the next round's (late, by more than the grace)."""
    rates = {"EUR": 1.0, "USD": 0.92, "GBP": 1.17}
    rate_rounds: dict[int, list[list[tuple]]] = {}
    delayed = blocks // 3
    for block in range(blocks):
        valid_from = DAY + timedelta(seconds=block * 86_400 // blocks + 300)
        rates = {c: (r if c == "EUR" else round(r * rng.uniform(0.98, 1.02), 4)) for c, r in rates.items()}
        rate_rounds.setdefault(block + 1 if block == delayed else block, []).append(
            [(c, r, valid_from) for c, r in rates.items()]
        )
    rate_rounds[delayed + 1].reverse()
    return rate_rounds


# The table properties the demo's sources are created with (ignored by Delta on a table that
# exists): the change data feed (a table's history), commit times that never go back, and each
# row's commit version (row tracking: a replay reads its slices from a snapshot, and the tables
# stay readable once they are older than Delta's retention). docs/semantics.md, "Row tracking".
SOURCE_TABLE = {
    "delta.enableChangeDataFeed": "true",
    "delta.enableInCommitTimestamps": "true",
    "delta.enableRowTracking": "true",
}


def write_tables(
    spark: SparkSession,
    root: str,
    data: DemoData,
    commits: slice = slice(None),
    only: tuple[str, ...] = (),
) -> None:
    """Write the demo tables (and the chosen range of stream commits) under `root`; `only`: just
    the tables named (a job that reads two of them needs no commit of the others). Each table is
    created as a source should be (`SOURCE_TABLE`), whatever the session's defaults. A name in
    `only` that is no demo table is refused before anything is written (else it writes nothing)."""
    known = list(dict.fromkeys([*data.tables, *(commit.table for commit in data.commits)]))
    unknown = [name for name in only if name not in known]
    if unknown:
        raise JobError(
            f"no demo table named {', '.join(map(repr, unknown))}; the demo's tables: {', '.join(known)} "
            "(give their names, not paths)"
        )
    for name, (schema, rows) in data.tables.items():
        path = f"{root}/{name}"
        if (not only or name in only) and not delta_io.exists(spark, path):
            local_frame(spark, rows, schema).write.format("delta").options(**SOURCE_TABLE).save(path)
    for commit in data.commits[commits]:
        if only and commit.table not in only:
            continue
        frame = local_frame(spark, commit.rows, commit.schema).coalesce(1)
        path = f"{root}/{commit.table}"
        if commit.key:
            delta_io.upsert(frame, path, commit.key)
        else:
            frame.write.format("delta").mode("append").options(**SOURCE_TABLE).save(path)


def demo_job(name: str, root: str) -> JoinSpec:
    """A job of jobs/ with its paths under the demo folder."""
    return load_job(job_file(name), root=Path(root).parent)


def job_file(name: str) -> Path:
    """The file of job `name` in jobs/, YAML or SQL."""
    (file,) = [p for p in job_files(JOBS_DIR) if p.stem == name]
    return file


def run_demo(root: str, master: str | None = None, seed: int = 7) -> dict[str, dict[str, RunMetrics]]:
    """Generate the data, run each runnable demo job live (in two rounds) and replay it in both
    modes, print the summary; returns the metrics by job and run."""
    if not JOBS_DIR.is_dir():
        raise JobError(
            f"the demo runs from a clone of the repository: it uses its jobs/ folder, and {JOBS_DIR} is not "
            "there (an installed package); clone the repository and run `make demo`"
        )
    spark = get_spark(master=master, app_name="streamjoin-demo")
    shutil.rmtree(root, ignore_errors=True)
    data = generate(seed)
    print(
        f"demo data: {sum(len(c.rows) for c in data.commits)} rows in {len(data.commits)} commits under {root}",
        flush=True,
    )
    jobs = {name: demo_job(name, root) for name in RUNNABLE}
    runs = _run_jobs(spark, root, data, jobs)
    for name, job in jobs.items():
        _summarize(spark, name, job, runs[name])
    print(
        "\nunsettled rows arrived after the slower source's newest commit; open rows wait for their window to close"
        " (enrichment: for the table to be known past them). Both are settled by the next commits (docs/semantics.md)."
    )
    return runs


def _run_jobs(
    spark: SparkSession, root: str, data: DemoData, jobs: dict[str, JoinSpec]
) -> dict[str, dict[str, RunMetrics]]:
    """Each job live over the first half of the commits, live again over the rest, then replayed
    in both modes; the metrics by job and run (`live`, `exact`, `complete`)."""
    say = functools.partial(print, flush=True)  # a line per step: the demo takes minutes
    half = len(data.commits) // 2
    say(f"writing the first {half} commits")
    write_tables(spark, root, data, slice(0, half))
    for job in jobs.values():
        bind(spark, job)  # fail before any data moves if a job does not fit its sources
    runners = {
        name: LiveRunner(spark, job, f"{job.output.location}_checkpoint") for name, job in jobs.items()
    }
    # The jobs run side by side: each one's time is mostly driver-side latency, which overlaps.
    first = _side_by_side(
        {
            name: functools.partial(_timed_live, say, f"{name}: live over the first half", r)
            for name, r in runners.items()
        }
    )
    say(f"writing the other {len(data.commits) - half} commits")
    write_tables(spark, root, data, slice(half, None))
    again = _side_by_side(
        {
            name: functools.partial(_timed_live, say, f"{name}: live again, over what came since", r)
            for name, r in runners.items()
        }
    )
    start, end = DAY - timedelta(days=1), DAY + timedelta(days=2)
    replays = _side_by_side(
        {
            (name, mode): functools.partial(_timed_replay, say, name, spark, job, mode, Slice(start, end))
            for name, job in jobs.items()
            for mode in ("exact", "complete")
        }
    )
    return {
        name: {"live": combine(first[name] + again[name])}
        | {mode: replays[(name, mode)] for mode in ("exact", "complete")}
        for name in jobs
    }


def _summarize(spark: SparkSession, name: str, job: JoinSpec, runs: dict[str, RunMetrics]) -> None:
    """Print a job's runs, whether live equals the exact replay, and what lateness cost."""
    same, gained, lost = _differences(
        *(
            delta_io.read_snapshot(spark, location)
            for location in (
                job.output.location,
                f"{job.output.location}_replay_exact",
                f"{job.output.location}_replay_complete",
            )
        )
    )
    print(f"\n== {name}: {job.meta.description}")
    for run in runs.values():
        print("  " + run.summary())
    print(f"  live output equals the exact replay: {'yes' if same else 'NO'}")
    print(
        f"  what lateness cost ({runs['exact'].total('late')} late input rows): {gained} output rows appear only when "
        f"every row counts as on time, {lost} appear only in the exact output (e.g. padded where the late partner was cut)"
    )
    print(
        f"  outputs: {job.output.location} (live), {job.output.location}_replay_exact, _replay_complete; "
        f"side tables {job.output.side('late')}, {job.output.side('rejected')}; metrics {job.output.side('metrics')}"
    )


def _differences(live: DataFrame, exact: DataFrame, complete: DataFrame) -> tuple[bool, int, int]:
    """The three outputs as multisets, in one Spark job: whether the live output equals the exact
    replay, how many rows only the complete replay holds (gained when every row counts as on
    time) and how many only the exact one holds (lost), counted as `exceptAll` counts them."""
    columns = [F.col(f"`{c}`") for c in exact.columns]
    tagged = [
        frame.select(*columns, F.lit(tag).alias("_sj_from"))
        for tag, frame in (("live", live), ("exact", exact), ("complete", complete))
    ]
    per_row = (
        functools.reduce(DataFrame.unionByName, tagged)
        .groupBy(*columns)
        .agg(
            *(
                F.count_if(F.col("_sj_from") == tag).alias(f"_sj_{tag}")
                for tag in ("live", "exact", "complete")
            )
        )
    )
    live_n, exact_n, complete_n = F.col("_sj_live"), F.col("_sj_exact"), F.col("_sj_complete")
    totals = per_row.agg(
        F.sum(F.abs(live_n - exact_n)).alias("unequal"),
        F.sum(F.greatest(complete_n - exact_n, F.lit(0))).alias("gained"),
        F.sum(F.greatest(exact_n - complete_n, F.lit(0))).alias("lost"),
    ).first()
    assert totals is not None  # an aggregate without grouping returns exactly one row
    unequal, gained, lost = (totals[c] or 0 for c in ("unequal", "gained", "lost"))
    return unequal == 0, gained, lost


def _side_by_side(calls: dict) -> dict:
    """Run independent calls (by key) at once in threads; their results by key (the first error raised)."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = {key: pool.submit(call) for key, call in calls.items()}
        return {key: future.result() for key, future in futures.items()}


def _timed_replay(
    say: Callable[[str], None],
    name: str,
    spark: SparkSession,
    job: JoinSpec,
    mode: str,
    slice_: Slice,
) -> RunMetrics:
    """Replay `job` over `slice_` in `mode` into `<output>_replay_<mode>`, saying how long it took.
    The replay reads lateness from the job's own arrival index, which its live runs have filled."""
    target = replace(job.output, path=f"{job.output.location}_replay_{mode}")
    began = time.monotonic()
    (metrics,) = replay_slices(spark, job, [slice_], RunOptions(mode=mode, into=target))
    say(f"{name}: replay, {mode} mode: {metrics.rows_out} rows out in {time.monotonic() - began:.0f} s")
    return metrics


def _timed_live(say: Callable[[str], None], what: str, runner: LiveRunner) -> list[RunMetrics]:
    """Run `runner` available-now, saying what it did and how long it took."""
    began = time.monotonic()
    runs = runner.run()
    say(
        f"{what}: {len(runs)} micro-batch(es), {sum(r.rows_out for r in runs)} rows out in {time.monotonic() - began:.0f} s"
    )
    return runs
