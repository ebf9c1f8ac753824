"""Commands that read no data start no JVM (issue 81, item 1): run as a newcomer runs them, in a
process with no Java on PATH and no $JAVA_HOME, they answer in about a second; a command that
needs Spark says that it starts it, and without Java says what to install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
JOB = """
sources:
  clicks: {path: ads/clicks, time: ts}
  views: {path: ads/views, time: ts}
from: clicks
joins: [{join: views, using: [ad_id], within: 1h, grace: 10m}]
output: {path: ads/out}
"""
SQL_JOB = """
CREATE STREAM clicks WITH (path='ads/clicks', time='ts');
CREATE STREAM views WITH (path='ads/views', time='ts');
CREATE STREAM attributed WITH (path='ads/attributed') AS
SELECT clicks.ad_id, views.page
FROM clicks JOIN views WITHIN 1 HOUR GRACE PERIOD 10 MINUTES ON clicks.ad_id = views.ad_id;
"""


def without_java(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """`streamjoin ARGS` in a process whose PATH holds no java (an empty folder) and no $JAVA_HOME."""
    env = {key: value for key, value in os.environ.items() if key != "JAVA_HOME"}
    empty = folder / "no-java-here"
    empty.mkdir(exist_ok=True)
    env |= {"PATH": str(empty), "PYTHONPATH": str(REPOSITORY), "STREAMJOIN_ROOT": str(folder)}
    return subprocess.run(
        [sys.executable, "-m", "streamjoin.cli", *args],
        env=env,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
    )


def jobs(folder: Path) -> Path:
    """A folder of job files: one YAML, one SQL (the tables they name do not exist), one invalid."""
    (folder / "jobs").mkdir()
    (folder / "jobs" / "clicks.yaml").write_text(JOB)
    (folder / "jobs" / "attributed.sql").write_text(SQL_JOB)
    (folder / "jobs" / "broken.yaml").write_text(JOB.replace("within: 1h, ", ""))
    return folder / "jobs"


def test_help_version_and_list_start_no_jvm(tmp_path):
    folder = jobs(tmp_path)
    version = without_java(tmp_path, "--version")
    assert version.returncode == 0 and version.stdout.startswith("streamjoin ")
    helped = without_java(tmp_path, "explain", "--help")
    assert helped.returncode == 0 and "--structure-only" in helped.stdout
    listed = without_java(tmp_path, "list", "--jobs", str(folder))
    assert listed.returncode == 0, listed.stderr
    assert f"clicks ({folder}/clicks.yaml): output {tmp_path}/ads/out; never run" in listed.stdout
    assert "attributed (" in listed.stdout and "broken.yaml: invalid: " in listed.stdout
    assert "Spark" not in listed.stderr and "Traceback" not in listed.stderr


def test_structure_only_checks_and_explains_the_file_with_no_jvm(tmp_path):
    folder = jobs(tmp_path)
    checked = without_java(tmp_path, "validate-job", str(folder / "clicks.yaml"), "--structure-only")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.splitlines() == [
        "job clicks: structure ok (2 sources, 1 join(s))",
        "job clicks: columns and types not checked (--structure-only: the file alone, no Spark)",
    ]
    broken = without_java(tmp_path, "validate-job", str(folder / "broken.yaml"), "--structure-only")
    assert broken.returncode == 2 and "needs time bounds" in broken.stderr
    explained = without_java(tmp_path, "explain", str(folder / "attributed.sql"), "--structure-only")
    assert explained.returncode == 0, explained.stderr
    lines = explained.stdout.splitlines()
    assert "the SQL job as YAML (the same job; either file runs):" in lines
    assert f"  clicks: stream at {tmp_path}/ads/clicks, event time ts" in lines
    assert "  1. INNER JOIN views: IntervalLink(" in explained.stdout
    assert "grace=10m" in explained.stdout
    document = json.loads(
        without_java(tmp_path, "explain", str(folder / "clicks.yaml"), "--structure-only", "--json").stdout
    )
    assert document["checked"] == "structure" and [s["name"] for s in document["sources"]] == [
        "clicks",
        "views",
    ]
    assert (
        document["joins"][0]["source"] == "views" and document["output"]["location"] == f"{tmp_path}/ads/out"
    )


def test_a_command_that_reads_data_says_it_starts_spark_and_what_java_it_needs(tmp_path):
    folder = jobs(tmp_path)
    explained = without_java(tmp_path, "explain", str(folder / "clicks.yaml"))
    assert explained.returncode == 2 and "Traceback" not in explained.stderr
    starting, refused = explained.stderr.splitlines()
    assert starting == "job clicks: starting Spark (a JVM, once per command) ..."
    assert refused.startswith("streamjoin: error: this command runs Spark, which needs Java 17")
    assert "install a JDK 17 and put its java on PATH or set JAVA_HOME" in refused
    ranged = without_java(
        tmp_path, "explain", str(folder / "clicks.yaml"), "--structure-only", "--start", "2024-05-01"
    )
    assert ranged.returncode == 2 and "starting Spark" not in ranged.stderr
    assert "explain --structure-only reads no table, so it takes no --start" in ranged.stderr
