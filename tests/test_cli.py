"""The CLI on every job in jobs/, and the demo end to end."""

from __future__ import annotations

import contextlib
import io
import json
import re
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aging import vacuum, write_commits
from harness import create_tables, write_commit
from test_no_jvm import without_java

from streamjoin import delta_io
from streamjoin.cli import build_parser, main
from streamjoin.definition import definition_hash
from streamjoin.demo import run_demo
from streamjoin.jobfile import job_files, load_job
from streamjoin.timeutil import from_spark

JOBS = job_files(Path(__file__).resolve().parent.parent / "jobs")


@pytest.fixture(scope="module")
def demo(spark, tmp_path_factory):
    """The demo run once for the module: its data doubles as the sources of the jobs in jobs/.
    Returns the folder, the demo's metrics and what it printed."""
    root = tmp_path_factory.mktemp("cli")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        results = run_demo(str(root / "demo"))
    return root, results, printed.getvalue()


def test_demo_outputs_exist_and_counts_add_up(spark, demo, capsys):
    root, results, printed = demo
    assert set(results) == {"orders_payments", "payments_shipments", "orders_rates", "orders_fulfilment"}
    # Issue 18, item 4: the demo says each step as it ends (it takes minutes), then the summary.
    steps = ["writing the first ", "orders_payments: live over the first half: ", "writing the other "]
    steps += ["orders_rates: live again, over what came since: ", "orders_payments: replay, exact mode: "]
    assert all(step in printed for step in steps), printed
    assert [printed.index(step) for step in steps] == sorted(printed.index(step) for step in steps)
    assert printed.index("orders_payments: replay, complete mode: ") < printed.index("== orders_payments")
    for job, runs in results.items():
        output = root / "demo" / "out" / job
        assert delta_io.exists(spark, str(output))
        for run in runs.values():
            assert run.balanced(), run.summary()
            assert run.total("rows_in") > 0
        # The live run and the exact replay agree on every count and on the rows.
        live, exact, complete = runs["live"], runs["exact"], runs["complete"]
        for bucket in (
            "rows_in",
            "rejected",
            "late",
            "joined",
            "unmatched_emitted",
            "unmatched_dropped",
            "open",
            "unsettled",
            "applied",
        ):
            assert live.total(bucket) == exact.total(bucket), bucket
        assert live.rows_out == exact.rows_out == delta_io.read_snapshot(spark, str(output)).count()
        assert complete.total("late") == 0
        # The summary compares the outputs as multisets: equal live and exact; what lateness cost
        # adds up to the difference of the replays' sizes.
        summary = printed.split(f"\n== {job}: ")[1].split("\n== ")[0]
        assert "live output equals the exact replay: yes" in summary, summary
        cost = re.search(
            r"\): (\d+) output rows appear only when .*, (\d+) appear only in the exact", summary
        )
        assert cost is not None, summary
        assert int(cost[1]) - int(cost[2]) == complete.rows_out - exact.rows_out, summary
    for job in ("orders_payments", "payments_shipments"):
        assert results[job]["exact"].total("rejected") == 4  # the payments without an order id
    assert results["orders_payments"]["exact"].total("late") > 0
    # Enrichment: every order is decided (the rates' watermark passes them all) and joined; the
    # round of rates that came a round late is late (3 currencies) and changes some orders' rate.
    rates = results["orders_rates"]
    assert rates["exact"].sources["orders"].joined == rates["live"].sources["orders"].joined == 120
    assert rates["live"].sources["currency_rates"].late == 3 and rates["complete"].total("late") == 0
    # The three-way chain: each link reached, matched, padded and passed on the same rows live and
    # replayed; its unpaid orders are padded at the first link and reach the second one.
    chain = results["orders_fulfilment"]
    fields = ("link", "reached", "matched", "padded", "dropped", "passed")
    live_links, exact_links = (
        [tuple(getattr(link, f) for f in fields) for link in chain[run].links] for run in ("live", "exact")
    )
    assert live_links == exact_links, (live_links, exact_links)
    assert [link[0] for link in exact_links] == [
        "1. LEFT JOIN payments",
        "2. LEFT JOIN shipments",
        "3. LEFT JOIN customers",
    ]
    first, second, _ = chain["exact"].links
    assert first.padded > 0 and first.matched > 0 and second.matched > 0


def test_validate_job_on_every_job(demo, capsys):
    root, _, _ = demo
    for job in JOBS:
        assert main(["--root", str(root), "validate-job", str(job)]) == 0
        out = capsys.readouterr().out
        assert "structure ok" in out and "columns, types, expressions and change data feeds ok" in out, out


def test_a_job_whose_definition_changed_is_refused_before_any_data_moves(spark, demo, tmp_path, capsys):
    """The demo's runs stored orders_payments' definition hash with its index (and output); the job
    with a longer grace would decide other rows: replay and backfill refuse it in one line (exit
    2) and write nothing. Its file with another description hashes as before."""
    root, _, _ = demo
    original = JOBS_BY_NAME["orders_payments"]
    index = str(root / "demo" / "out" / "orders_payments_index")
    stored = delta_io.table_properties(spark, index)["streamjoin.definition"]
    assert stored == definition_hash(load_job(original, root=root))
    changed = tmp_path / "orders_payments.yaml"
    changed.write_text(original.read_text().replace("grace: 150m", "grace: 3h"))
    versions = {
        name: delta_io.latest_version(spark, index.removesuffix("_index") + name) for name in ("", "_index")
    }
    for command in ("replay", "backfill"):
        code = main(
            ["--root", str(root), command, str(changed), "--start", "2024-05-01", "--end", "2024-05-02"]
        )
        error = capsys.readouterr().err
        assert code == 2, error
        assert re.search(r"its definition changed since its (output|arrival index) \S+ was written", error)
        assert f"(definition {stored} there, " in error and "streamjoin reset" in error
        assert len(error.strip().splitlines()) == 1, error
    after = {
        name: delta_io.latest_version(spark, index.removesuffix("_index") + name) for name in ("", "_index")
    }
    assert after == versions  # nothing written
    described = tmp_path / "described" / "orders_payments.yaml"
    described.parent.mkdir()
    described.write_text(original.read_text().replace("description: orders", "description: all orders"))
    assert definition_hash(load_job(described, root=root)) == stored


def test_explain_on_every_job(demo, capsys):
    root, _, _ = demo
    for job in JOBS:
        assert main(["--root", str(root), "explain", str(job)]) == 0
        out = capsys.readouterr().out
        assert f"job {job.stem}" in out
        assert "pinned version" in out and "join chain" in out and "output:" in out
    main(["--root", str(root), "explain", str(JOBS_BY_NAME["orders_payments"])])
    out = capsys.readouterr().out
    assert "BETWEEN 0s AND 1h" in out and "grace 2h30m" in out and "live state:" in out
    # paid_at - order_time in [0s, 1h]: a slice needs the orders up to 1h before it (their payments
    # fall in it) and the payments up to 1h after it (they decide whether its orders are unpaid)
    assert "orders from start - 1h to end + 0s, payments from start - 0s to end + 1h" in out


def test_explain_prints_a_replays_plan_for_a_range_without_moving_data(spark, demo, capsys):
    """Given --start and --end, explain prints the replay's plan: the range, the version each
    source is read at, the event times read (the range widened by each source's margins) and the
    tables written; nothing is written. One end alone is refused."""
    root, _, _ = demo
    job = str(JOBS_BY_NAME["orders_payments"])
    spec = load_job(job, root=root)
    tables = [spec.output.location, spec.output.side("index"), spec.output.side("metrics")]
    before = [delta_io.latest_version(spark, t) for t in tables]
    range_ = ["--start", "2024-05-01T00:00Z", "--end", "2024-05-02T00:00Z"]
    assert main(["--root", str(root), "explain", job, *range_]) == 0
    out = capsys.readouterr().out
    assert "replay of job orders_payments over [2024-05-01T00:00:00+00:00, 2024-05-02T00:00:00+00:00)" in out
    read = {line.split(":", 1)[0].strip(): line for line in out.split("reads (", 1)[1].splitlines()[1:3]}
    assert "event time in [2024-04-30T23:00:00+00:00, 2024-05-02T00:00:00+00:00)" in read["orders"]
    assert "event time in [2024-05-01T00:00:00+00:00, 2024-05-02T01:00:00+00:00)" in read["payments"]
    assert main(["--root", str(root), "explain", job, *range_, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    versions = {s["name"]: s["version"] for s in plan["sources"]}
    assert plan["replay"]["versions"] == versions and plan["replay"]["margins_s"]["orders"] == [3600.0, 0.0]
    assert all(f"at version {versions[name]}" in read[name] for name in versions)
    written = {w["table"]: w["what"] for w in plan["replay"]["writes"]}
    assert written[spec.output.location] == "its rows in the slices, replaced"
    assert [delta_io.latest_version(spark, t) for t in tables] == before  # no data moved
    assert main(["--root", str(root), "explain", job, "--start", "2024-05-01"]) == 2
    assert "give both --start and --end" in capsys.readouterr().err


JOBS_BY_NAME = {job.stem: job for job in JOBS}


def test_replay_command_replaces_its_slice(spark, demo, capsys):
    root, _, _ = demo
    job = str(JOBS_BY_NAME["orders_payments"])
    output = str(root / "demo" / "out" / "orders_payments")
    before = delta_io.read_snapshot(spark, output).count()
    args = [
        "--root",
        str(root),
        "replay",
        job,
        "--start",
        "2024-05-01T02:00+02:00",
        "--end",
        "2024-05-01T12:00Z",
        "--mode",
        "exact",
    ]
    assert main(args) == 0
    assert main(args) == 0  # re-running the slice changes nothing
    out = capsys.readouterr().out
    assert "orders_payments replay/exact" in out and "adds up: yes" in out
    assert delta_io.read_snapshot(spark, output).count() == before


def test_replay_takes_a_closed_input_only_when_told():
    """`--closed` (docs/semantics.md, "Replays") reaches the replay; without it nothing is assumed."""
    base = ["replay", "job.yaml", "--start", "2024-05-01", "--end", "2024-05-02"]
    assert build_parser().parse_args([*base, "--closed"]).closed is True
    assert build_parser().parse_args(base).closed is False


def test_errors_exit_with_a_message(demo, capsys, tmp_path):
    root, _, _ = demo
    customers = tmp_path / "customers.yaml"
    customers.write_text(
        "sources: {a: {path: demo/customers, kind: table, key: [customer_id]}, b: {path: demo/currency_rates, kind: table, key: [currency]}}\n"
        "from: a\njoins: [{join: b, on: a.name = b.valid_from}]\noutput: {path: demo/out/tt}\n"
    )
    assert (
        main(["--root", str(root), "replay", str(customers), "--start", "2024-05-01", "--end", "2024-05-02"])
        == 2
    )
    assert "many-to-many join" in capsys.readouterr().err
    assert (
        main(
            [
                "--root",
                str(root),
                "replay",
                str(JOBS_BY_NAME["orders_payments"]),
                "--start",
                "2024-05-02",
                "--end",
                "2024-05-01",
            ]
        )
        == 2
    )
    assert "start must be before end" in capsys.readouterr().err
    replay_day = ["--root", str(root), "replay", str(JOBS_BY_NAME["orders_payments"])]
    replay_day += ["--start", "2024-05-01", "--end", "2024-05-02", "--versions"]
    assert main([*replay_day, "orders=1,x=1"]) == 2  # issue 20, item 4: refused before data moves
    assert (
        "versions are given for 'x', which job 'orders_payments' has no source of" in capsys.readouterr().err
    )
    assert main([*replay_day, "orders=99999"]) == 2
    assert "has no version 99999: its versions run from 0 to " in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "sources: {a: {path: a, time: t}, b: {path: b, time: t}}\nfrom: a\njoins: [{join: b, using: [id]}]\noutput: {path: o}\n"
    )
    assert main(["validate-job", str(bad)]) == 2
    assert "needs time bounds" in capsys.readouterr().err
    missing = tmp_path / "missing.yaml"  # issue 20, item 7: a source that is not there fails
    missing.write_text(
        "sources: {a: {path: nowhere_a, time: t}, b: {path: nowhere_b, time: t}}\nfrom: a\n"
        "joins: [{join: b, using: [id], within: 1h}]\noutput: {path: o}\n"
    )
    assert main(["--root", str(tmp_path), "validate-job", str(missing)]) == 2
    assert f"no Delta table at {tmp_path}/nowhere_a (source a)" in capsys.readouterr().err
    assert main(["--root", str(tmp_path), "validate-job", str(missing), "--structure-only"]) == 0
    assert "columns and types not checked (--structure-only" in capsys.readouterr().out


def test_version(capsys):
    from streamjoin import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"streamjoin {__version__}" and __version__[0].isdigit()


def test_help_on_each_command(capsys):
    commands = (
        "demo",
        "validate-job",
        "explain",
        "replay",
        "backfill",
        "handoff",
        "report",
        "stream",
        "index",
        "list",
    )
    for command in commands:
        with pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0
        out = capsys.readouterr().out
        assert "usage: streamjoin" in out and "--master" in out  # global options after the command too
    # every argument says what it is (issue 18, item 5)
    for action in build_parser()._subparsers._group_actions[0].choices.values():
        for argument in action._actions:
            assert argument.help, (action.prog, argument.dest)


def test_a_timeout_that_is_not_positive_is_refused_before_anything_runs(capsys):
    for command in ("stream", "handoff"):
        extra = ["--at", "2024-05-01"] if command == "handoff" else []
        for timeout in ("0", "-5", "soon"):
            with pytest.raises(SystemExit) as done:
                main([command, "any.yaml", *extra, "--timeout", timeout])
            assert done.value.code == 2
            assert f"{timeout!r} is not a positive number of seconds; give e.g. 60" in capsys.readouterr().err


def test_stream_command_resumes_the_demo_checkpoint(demo, capsys):
    root, _, _ = demo
    assert main(["--root", str(root), "stream", str(JOBS_BY_NAME["payments_shipments"])]) == 0
    out = capsys.readouterr().out
    assert "nothing new to process" in out  # the demo's live run already consumed every commit
    assert "payments_shipments_checkpoint" in out


def test_verify_command_finds_the_demo_live_output_equal_to_the_replay(demo, capsys):
    """The README's verify command on the demo: every 6-hour slice of its day equal, recorded."""
    root, _, _ = demo
    job = str(JOBS_BY_NAME["orders_payments"])
    assert (
        main(
            [
                "verify",
                job,
                "--root",
                str(root),
                "--start",
                "2024-05-01",
                "--end",
                "2024-05-02",
                "--every",
                "6h",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "all 4 slice(s) equal" in out and "orders_payments_consistency" in out
    assert out.count(": equal, ") == 4


def test_validate_and_explain_refuse_what_the_runners_refuse(spark, demo, capsys, tmp_path):
    """Issue 18, item 3: one set of checks. A chain the runners cannot run yet (a CROSS join after
    an interval join) and a source without change data feed pass the file's structure but fail
    validate-job and explain, as replay refuses them."""
    root, _, _ = demo
    chain = tmp_path / "chain.yaml"
    chain.write_text(
        "sources:\n"
        "  orders: {path: demo/orders, time: order_time}\n"
        "  payments: {path: demo/payments, time: paid_at}\n"
        "  again: {path: demo/payments, time: paid_at}\n"
        "from: orders\n"
        "joins:\n"
        "  - {join: payments, on: orders.order_id = payments.order_id, within: 1h}\n"
        "  - {join: again, type: cross, within: 1h}\n"
        "output: {path: demo/out/chain}\n"
    )
    for command in ("validate-job", "explain"):
        assert main(["--root", str(root), command, str(chain)]) == 2, command
        assert (
            "join 2 (CROSS JOIN again, family interval) cannot follow the interval join"
            in capsys.readouterr().err
        )
    payments = delta_io.read_snapshot(spark, str(root / "demo" / "payments"))
    payments.write.format("delta").option("delta.enableChangeDataFeed", "false").save(
        str(tmp_path / "no_feed")
    )
    no_feed = tmp_path / "no_feed.yaml"
    no_feed.write_text(
        JOBS_BY_NAME["orders_payments"]
        .read_text()
        .replace("path: demo/payments", f"path: {tmp_path}/no_feed")
    )
    for command in ("validate-job", "explain"):
        assert main(["--root", str(root), command, str(no_feed)]) == 2, command
        assert "does not record its change data feed" in capsys.readouterr().err


def test_a_grace_shorter_than_the_commit_spacing_is_warned_and_its_late_rows_explained(
    spark, capsys, tmp_path
):
    """Issue 18, item 2: two tables committed every 6 hours (3 hours apart), a 10-minute grace.
    validate-job and explain say so with the numbers; the replay's summary points at it."""
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0, tzinfo=None) - timedelta(days=3)
    for side, offset in (("l", 0), ("r", 3)):
        commits = []
        for n in range(5):
            when = start + timedelta(hours=offset + 6 * n)
            rows = [
                (f"{side}{n}_{m}", "k", when - timedelta(hours=m), 0) for m in range(6)
            ]  # rows of the last 6 h
            commits.append((when, rows))
        write_commits(
            spark,
            str(tmp_path / side),
            commits,
            "id string, k string, t timestamp, v int",
            {"delta.enableChangeDataFeed": "true"},
        )
    job = tmp_path / "spaced.yaml"
    job.write_text(
        "sources: {l: {path: l, time: t}, r: {path: r, time: t}}\nfrom: l\n"
        "joins: [{join: r, on: l.k = r.k, within: 1h, grace: 10m}]\n"
        "select: [l.id AS lid, r.id AS rid]\noutput: {path: out}\n"
    )
    for command in ("validate-job", "explain"):
        assert main(["--root", str(tmp_path), command, str(job)]) == 0
        printed = capsys.readouterr().out
        for side in ("l", "r"):  # issue 81, item 2: the rows' lag behind their commit, not the spacing
            assert (
                f"5 of the last 5 commits of source {side!r} hold rows more than grace (10m) older than the "
                "commit (its commits' oldest rows trail them by 5h at the median, 5h at most)" in printed
            )
        assert "Set grace to at least 5h" in printed
    day = [start.isoformat(), (start + timedelta(days=2)).isoformat()]
    assert main(["--root", str(tmp_path), "replay", str(job), "--start", day[0], "--end", day[1]]) == 0
    assert re.search(
        r"\| \d+% of the rows arrived late: is grace shorter than the time between", capsys.readouterr().out
    )


def test_daily_commits_of_fresh_rows_need_no_day_of_grace(spark, capsys, tmp_path):
    """Issue 81, item 2: rates committed once a day, each with rows 3 minutes older than the commit,
    beside a stream committing hourly: a 1-hour grace draws no warning (the old one asked for a
    day); a 1-minute grace is warned with the lag and the grace that covers it."""
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0, tzinfo=None) - timedelta(days=5)
    daily = [
        (start + timedelta(days=n), [(f"r{n}", "EUR", start + timedelta(days=n, minutes=-3), n)])
        for n in range(4)
    ]
    hourly = [
        (start + timedelta(hours=n, minutes=30), [(f"l{n}", "EUR", start + timedelta(hours=n), n)])
        for n in range(80)
    ]
    schema = "id string, k string, t timestamp, v int"
    write_commits(spark, str(tmp_path / "rates"), daily, schema, {"delta.enableRowTracking": "false"})
    write_commits(spark, str(tmp_path / "orders"), hourly, schema)
    job = tmp_path / "fx.yaml"
    text = (
        "sources: {orders: {path: orders, time: t}, rates: {path: rates, time: t}}\nfrom: orders\n"
        "joins: [{join: rates, on: orders.k = rates.k, within: 1d, grace: GRACE}]\n"
        "select: [orders.id AS oid, rates.id AS rid]\noutput: {path: out}\n"
    )
    job.write_text(text.replace("GRACE", "1h"))
    assert main(["--root", str(tmp_path), "validate-job", str(job)]) == 0
    assert "grace" not in capsys.readouterr().out
    job.write_text(text.replace("GRACE", "1m"))
    assert main(["--root", str(tmp_path), "validate-job", str(job)]) == 0
    printed = capsys.readouterr().out
    assert (
        "4 of the last 4 commits of source 'rates' hold rows more than grace (1m) older than the commit "
        "(its commits' oldest rows trail them by 3m at the median, 3m at most)" in printed
    )
    assert "Set grace to at least 3m" in printed and "source 'orders'" in printed  # orders trail by 30m
    assert "1d" not in printed
    # Compacted, and the files of its commits removed: the lag cannot be read, and it says so
    spark.sql(f"OPTIMIZE delta.`{tmp_path / 'rates'}`")
    vacuum(spark, tmp_path / "rates")
    assert main(["--root", str(tmp_path), "validate-job", str(job)]) == 0
    assert (
        "how far the commits of source 'rates' trail their rows cannot be measured (its recent commits' "
        "change files are gone and it has no row tracking), so grace (1m) is not checked against it"
    ) in capsys.readouterr().out


def two_streams_job(spark, tmp_path) -> tuple[dict[int, str], Path]:
    """Two streams of one row each and the job joining them (`job.yaml`, output `out`)."""
    paths = create_tables(spark, tmp_path)
    write_commit(spark, paths[0], [("a1", "k", 10, 1)])
    write_commit(spark, paths[1], [("b1", "k", 12, 1)])
    job = tmp_path / "job.yaml"
    job.write_text(
        f"sources: {{l: {{path: {paths[0]}, time: t}}, r: {{path: {paths[1]}, time: t}}}}\nfrom: l\n"
        "joins: [{join: r, on: l.k = r.k, within: 10s, grace: 5s}]\nselect: [l.id AS lid, r.id AS rid]\n"
        f"output: {{path: {tmp_path}/out}}\n"
    )
    return paths, job


def test_ctrl_c_on_stream_stops_between_batches_and_says_how_to_resume(spark, tmp_path):
    """Issue 18, item 4: `stream` prints a line per micro-batch; Ctrl-C (SIGINT) lets the batch in
    progress finish, exits 0 without a traceback and prints the command that resumes. Issue 81,
    item 6: once the committed rows are processed and nothing new comes, it prints a heartbeat every
    --heartbeat seconds: since when it waits, and each source's newest commit."""
    paths, job = two_streams_job(spark, tmp_path)
    stream = ["stream", str(job), "--trigger", "processing-time:1s", "--heartbeat", "1"]
    child = subprocess.Popen(
        [sys.executable, "-m", "streamjoin.cli", *stream],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    lines = []
    for line in child.stdout:  # until the first micro-batch is reported, then the first heartbeat
        lines.append(line)
        if " waiting for new data since " in line and any(
            seen.startswith("batch 0: in 2, out ") for seen in lines
        ):
            break
    else:
        raise AssertionError(
            f"no batch, then heartbeat: {lines}, {child.stderr.read() if child.stderr else ''}"
        )
    newest = [
        f"{side} version {delta_io.latest_version(spark, paths[n])} at "
        f"{from_spark(delta_io.history(spark, paths[n])[-1].timestamp):%Y-%m-%dT%H:%M:%SZ}"
        for n, side in enumerate("lr")
    ]
    heartbeat = (
        rf"job job: waiting for new data since \S+Z \(\d+s\); newest commits: {newest[0]}, {newest[1]}\n"
    )
    assert re.fullmatch(heartbeat, lines[-1]), (heartbeat, lines[-1])
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err[-3000:]
    assert f"resume with: streamjoin stream {job} --checkpoint {tmp_path}/out_checkpoint" in out
    assert "stopping after the current micro-batch" in err and "Traceback" not in err
    # Spark's start-up banner and its INFO lines stay out of the way (`--log-level INFO` brings
    # them back: tests/test_cluster.py's replay, a process of its own, runs with it).
    assert "Setting default log level" not in err and " INFO " not in err, err[:2000]


def test_json_output_parses_and_global_options_follow_the_command(spark, demo, capsys):
    """--json on explain, validate-job, replay, backfill and list: one JSON document each, with
    what the text says; --root given after the command (issue 18, item 5)."""
    root, _, _ = demo
    job = str(JOBS_BY_NAME["orders_payments"])

    def run(*args: str) -> object:
        code = main([*args, "--root", str(root), "--json"])
        out = capsys.readouterr().out
        assert code == 0, out
        return json.loads(out)

    plan = run("explain", job)
    assert plan["job"] == "orders_payments" and plan["joins"][0]["bounds_s"] == [0.0, 3600.0]
    margins = {s["name"]: s["replay_margins_s"] for s in plan["sources"]}
    assert margins == {"orders": [3600.0, 0.0], "payments": [0.0, 3600.0]}
    assert all(isinstance(s["version"], int) for s in plan["sources"])
    assert "order_id" in plan["output"]["columns"]
    checked = run("validate-job", job)
    assert checked["ok"] is True and checked["output_columns"] == plan["output"]["columns"]
    replayed = run("replay", job, "--start", "2024-05-01T00:00Z", "--end", "2024-05-01T12:00Z")
    metrics = replayed["metrics"]
    assert metrics["runner"] == "replay" and metrics["balanced"] is True
    assert metrics["sources"]["orders"]["rows_in"] > 0 and metrics["slice_start"].startswith(
        "2024-05-01T00:00"
    )
    phases = metrics["phases"]  # where the replay's time went (issue 14, item 3)
    assert list(phases) == ["prepare", "read", "join", "write"] and min(phases.values()) >= 0
    assert sum(phases.values()) <= metrics["duration_s"] + 0.01
    backfill = run(
        "backfill",
        job,
        "--start",
        "2024-05-01T00:00Z",
        "--end",
        "2024-05-01T12:00Z",
        "--every",
        "12h",
        "--no-validate",
    )
    (piece,) = backfill["slices"]
    assert piece["status"] == "succeeded" and piece["metrics"]["rows_out"] == metrics["rows_out"]
    listed = run("list", "--jobs", str(JOBS[0].parent))
    assert {j["job"] for j in listed} == {j.stem for j in JOBS}
    assert all(j["last_run"] is not None and j["output"].endswith(f"demo/out/{j['job']}") for j in listed)
    assert main(["list", "--jobs", str(JOBS[0].parent), "--root", str(root)]) == 0
    assert "orders_payments (" in capsys.readouterr().out
    # issue 81, item 1: list reads the last runs from the metrics tables' files, with no JVM
    unstarted = without_java(root, "list", "--jobs", str(JOBS[0].parent), "--json")
    assert json.loads(unstarted.stdout) == listed, unstarted.stderr


def test_the_python_facade_runs_a_job_as_the_cli_does(spark, demo):
    """README's Python section: `Job.load` checks the file alone; explain, validate and replay
    give what the commands print, and a replay of a live-written slice leaves its rows as they were."""
    from streamjoin import Job

    root, _, _ = demo
    job = Job.load(JOBS_BY_NAME["orders_payments"], root=root)
    assert job.name == "orders_payments" and job.checkpoint.endswith("orders_payments_checkpoint")
    validation = job.validate()
    assert validation.checked == "sources" and "order_id" in validation.output_columns
    assert validation.as_json()["reach"] and "the runners take it" in validation.text()
    explanation = job.explain()
    assert set(explanation.versions) == {"orders", "payments"}
    described = {source["name"]: source["version"] for source in explanation.as_json()["sources"]}
    assert described == explanation.versions and "orders_payments" in explanation.text()
    output = str(root / "demo" / "out" / "orders_payments")
    before = read_output_rows(spark, output)
    metrics = job.replay("2024-05-01T00:00Z", "2024-05-01T12:00Z")
    assert metrics.balanced() and metrics.rows_out > 0
    assert read_output_rows(spark, output) == before


def read_output_rows(spark, location: str) -> list:
    return sorted(map(tuple, delta_io.read_snapshot(spark, location).collect()), key=repr)
