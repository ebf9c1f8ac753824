"""Set-up from a fresh clone: no virtual environment, no jars; the set-up fetches both, once."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess

import pytest
from conftest import SHORT_LIVED_JVM

from streamjoin.session import PROJECT_ROOT

pytestmark = pytest.mark.slow  # a clone, a virtual environment, every package: minutes


# The smoke run's driver lives for seconds (conftest.SHORT_LIVED_JVM): about 2.5 s less.
SHORT_LIVED = {"STREAMJOIN_JAVA_OPTIONS": SHORT_LIVED_JVM}


def run(args, cwd, timeout=900, **extra_env):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYSPARK", "STREAMJOIN"))}
    return subprocess.run(
        args, cwd=cwd, env={**env, **extra_env}, capture_output=True, text=True, timeout=timeout
    )


def test_fresh_clone_sets_itself_up_and_runs_delta(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(PROJECT_ROOT), str(clone)], check=True)
    assert not (clone / ".venv").exists() and not (clone / ".jars").exists()
    # Without the driver class archive (a minute more): tests/test_delta_io.py checks the one the
    # suite's own set-up made. Without compiling every installed module (half a minute of CPU; the
    # suite runs on the bytecode its own set-up compiled).
    setup = run(
        ["bash", "infra/setup.sh"], clone, STREAMJOIN_NO_CLASS_ARCHIVE="1", STREAMJOIN_NO_BYTECODE="1"
    )
    assert setup.returncode == 0, setup.stderr[-3000:]
    jars = sorted(p for p in os.listdir(clone / ".jars") if p.endswith(".jar"))
    assert any(j.startswith("delta-spark_4.2_2.13-") for j in jars), jars
    assert any(j.startswith("delta-storage-") for j in jars), jars
    # Data Docs' styles and scripts, from the tarballs the suite's own set-up kept (no network)
    assert "streamjoin setup-docs-assets" not in setup.stderr
    assert (clone / ".docs-assets" / "jquery@3.7.1" / "dist" / "jquery.min.js").is_file()
    help_text = run([str(clone / ".venv/bin/streamjoin"), "--help"], clone)
    assert help_text.returncode == 0 and "replay" in help_text.stdout
    # The clone's session factory takes the clone's jars. (The same package laid out as an installed
    # one, below, starts Spark with Delta from the jars it fetches: one JVM for both layouts.)
    python = str(clone / ".venv/bin/python")
    found = run([python, "-c", "from streamjoin.jars import delta_jars; print(*delta_jars())"], clone)
    assert found.returncode == 0, found.stderr[-3000:]
    assert found.stdout.split() == [str(clone / ".jars" / j) for j in jars]
    again = run(
        ["bash", "infra/setup.sh"], clone, timeout=120, STREAMJOIN_NO_CLASS_ARCHIVE="1"
    )  # nothing left to do
    assert again.returncode == 0

    # Issue 18, item 8: the package alone, laid out as an installed one (no checkout around it),
    # fetches its jars with `setup-jars` (offline: set-up filled Maven's local repository) into
    # ~/.cache/streamjoin/jars, and its session finds them there, with its own log4j2 settings.
    installed, home = tmp_path / "site-packages", tmp_path / "home"
    shutil.copytree(clone / "streamjoin", installed / "streamjoin")
    alone = {"PYTHONPATH": str(installed), "HOME": str(home)}
    script = (
        "import tempfile\n"
        "from streamjoin.session import get_spark\n"
        "spark = get_spark(shuffle_partitions=1)\n"
        "path = tempfile.mkdtemp() + '/t'\n"
        "spark.range(3).write.format('delta').save(path)\n"
        "print('rows', spark.read.format('delta').load(path).count())\n"
        "print('jars', spark.sparkContext.getConf().get('spark.jars'))\n"
    )
    refused = run([python, "-c", script], tmp_path, **alone)
    assert refused.returncode != 0 and "run `streamjoin setup-jars` once" in refused.stderr
    # No class archive made here; a stale one instead, which Java must skip without a word.
    fetched = run(
        [python, "-m", "streamjoin.cli", "setup-jars", "--offline", "--no-class-archive"], tmp_path, **alone
    )
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr[-3000:]
    cache = home / ".cache" / "streamjoin" / "jars"
    assert sorted(p for p in os.listdir(cache) if p.endswith(".jar")) == jars
    (cache / "driver-classes.jsa").write_bytes(b"made by another Java for another classpath")
    smoke = run([python, "-c", script], tmp_path, **alone, **SHORT_LIVED)
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    assert smoke.stdout.splitlines()[0] == "rows 3" and str(cache) in smoke.stdout
    assert "Setting default log level" not in smoke.stderr  # the shipped log4j2 settings were found
    # Suites are looked for in ./expectations, and the demo (which needs the clone's jobs/) says so.
    suites = run(
        [python, "-c", "from streamjoin.validation import suites_folder; print(suites_folder())"],
        tmp_path,
        **alone,
    )
    assert suites.stdout.strip() == str(tmp_path / "expectations"), suites.stderr[-2000:]
    demo = run([python, "-m", "streamjoin.cli", "demo"], tmp_path, **alone)
    assert demo.returncode == 2 and "the demo runs from a clone of the repository" in demo.stderr


def test_the_suites_set_up_compiled_the_installed_modules():
    """Set-up compiles every installed module once: where PYTHONDONTWRITEBYTECODE is set, each
    process (a live runner's child, an Airflow command, a CLI run) would otherwise compile pyspark,
    pandas, Airflow and Great Expectations again, seconds each. Found, not imported (importing
    Airflow here would fix its home before tests/test_dags.py sets it)."""
    packages = ("airflow", "great_expectations", "pandas", "pyspark")
    missing = [name for name in packages if not os.path.exists(importlib.util.cache_from_source(find(name)))]
    assert not missing, f"no bytecode for {missing}: run `make setup` again"


def find(package: str) -> str:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, f"{package} is not installed"
    return spec.origin
