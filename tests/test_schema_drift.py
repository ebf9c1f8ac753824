"""Schema changes in sources (docs/semantics.md, "Schema changes in sources"): columns a job never
uses may be dropped or renamed (Delta's column mapping) and both runners go on; a change to a
column it uses is refused before data moves, naming the source, the column and the version."""

from __future__ import annotations

import pytest
from conftest import at
from harness import EVERYTHING

from streamjoin import delta_io
from streamjoin.cli import main
from streamjoin.errors import JobError
from streamjoin.frames import local_frame
from streamjoin.jobfile import load_job
from streamjoin.runners.live import LiveRunner
from streamjoin.runners.options import RunOptions
from streamjoin.runners.replay import replay

# The stream's time column is named `t`, like the table source: `t.name` must never be read as a
# field of the stream's column `t`.
EVENTS = "id string, k string, t timestamp, junk string"
PEOPLE = "k string, name string, extra string, note string"


def _create(spark, path: str, columns: str) -> None:
    """An empty Delta table with its change feed and column mapping by name (drops and renames)."""
    spark.sql(
        f"CREATE TABLE delta.`{path}` ({columns}) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true, "
        "delta.columnMapping.mode = 'name')"
    )


def _append(spark, path: str, rows: list[tuple], columns: str) -> None:
    local_frame(spark, rows, columns).write.format("delta").mode("append").save(path)


def _alter(spark, path: str, change: str) -> None:
    spark.sql(f"ALTER TABLE delta.`{path}` {change}")


def _job(root, select: str, output: str = "out") -> str:
    """A YAML job: stream s enriched from table t (LEFT), selecting `select`; its file's path."""
    text = f"""
name: drift
sources:
  s: {{path: {root}/s, time: t}}
  t: {{path: {root}/t, kind: table, key: k}}
from: s
joins:
  - join: t
    type: left
    on: s.k = t.k
select: [s.id, {select}]
output: {{path: {root}/{output}}}
"""
    path = root / f"{output}.yaml"
    path.write_text(text)
    return str(path)


def test_unused_columns_dropped_and_renamed_keep_both_runners_going(spark, tmp_path, capsys):
    """Drops and renames of columns the job does not use, in the table and in the stream, between
    commits the job reads: validate-job, a replay and a live run (from version 0, through every
    change) all go on, and live writes what the replay writes."""
    s, t = str(tmp_path / "s"), str(tmp_path / "t")
    _create(spark, s, EVENTS)
    _create(spark, t, PEOPLE)
    _append(spark, t, [("a", "Alice", "x", "n1"), ("b", "Bob", "y", "n2")], PEOPLE)
    _append(spark, s, [("s1", "a", at(10), "j")], EVENTS)
    _alter(spark, t, "DROP COLUMN extra")
    _alter(spark, t, "RENAME COLUMN note TO remark")
    _alter(spark, s, "DROP COLUMN junk")
    _append(spark, t, [("c", "Carol", "n3")], "k string, name string, remark string")
    _append(spark, s, [("s2", "c", at(30)), ("s3", "b", at(31))], "id string, k string, t timestamp")
    job = _job(tmp_path, "t.name")
    assert main(["validate-job", job]) == 0
    assert "ok" in capsys.readouterr().out
    spec = load_job(job)
    metrics = replay(spark, spec, *EVERYTHING, options=RunOptions(closed=True))
    assert metrics.balanced()
    rows = {
        tuple(r) for r in delta_io.read_snapshot(spark, spec.output.location).select("id", "name").collect()
    }
    assert rows == {("s1", "Alice"), ("s2", "Carol"), ("s3", "Bob")}

    live = load_job(_job(tmp_path, "t.name", output="live"))
    runs = LiveRunner(spark, live, str(tmp_path / "ck")).run()
    assert runs and all(r.balanced() for r in runs)
    replayed = {tuple(r) for r in delta_io.read_snapshot(spark, spec.output.location).collect()}
    written = {tuple(r) for r in delta_io.read_snapshot(spark, live.output.location).collect()}
    assert written and written <= replayed  # rows the live run has settled so far: the same rows


def test_a_change_to_a_column_the_job_uses_is_refused_before_data_moves(spark, tmp_path, capsys):
    """A column the job selects renamed inside the versions a run reads: validate-job and the replay
    refuse in one line naming the source, the column, the version and what to do, and nothing is
    written. A job naming a column by its old name, or a dropped one, is told the version that
    renamed or dropped it, and `t.extra` is not read as a field of the stream's own column `t`."""
    s, t = str(tmp_path / "s"), str(tmp_path / "t")
    _create(spark, s, EVENTS)
    _create(spark, t, PEOPLE)
    _append(spark, t, [("a", "Alice", "x", "n1")], PEOPLE)
    _append(spark, s, [("s1", "a", at(10), "j")], EVENTS)
    _alter(spark, t, "RENAME COLUMN name TO label")  # version 2
    _alter(spark, t, "DROP COLUMN extra")  # version 3

    renamed = _job(tmp_path, "t.label")
    assert main(["validate-job", renamed]) == 2
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1
    for part in ("source 't'", t, "column 'label'", "renamed (from 'name') at version 2", "--from t=2"):
        assert part in message, message
    with pytest.raises(
        JobError, match=r"column 'label', which the job uses, was renamed \(from 'name'\) at version 2"
    ):
        replay(spark, load_job(renamed), *EVERYTHING)
    assert not delta_io.exists(spark, str(tmp_path / "out"))

    old_name = _job(tmp_path, "t.name", output="old")
    assert main(["validate-job", old_name]) == 2
    message = capsys.readouterr().err.strip()
    assert "column 'name' was renamed to 'label' at version 2. Name it t.label" in message, message

    dropped = _job(tmp_path, "t.extra", output="other")
    assert main(["validate-job", dropped]) == 2
    message = capsys.readouterr().err.strip()
    assert "t.extra names no column of source 't'" in message, message
    assert "'extra' was dropped from it at version 3. Remove t.extra from the job" in message
    assert "extract" not in message  # not Spark's reading of `t.extra` as a field of the stream's column t
