"""Delta's JVM jars: where the session factory finds them, and fetching them once (`setup-jars`).

pyspark ships Spark's jars but not Delta's. Set-up resolves Delta and its runtime dependencies
with Maven from the POM shipped in this package (resources/jvm-deps.xml) and keeps the jars
pyspark does not already ship (by artifact name), so the classpath holds one version of each
library: Spark's. The object storage connector (resources/object-storage.xml: hadoop-aws at
pyspark's Hadoop version and the AWS SDK bundle) goes into the subfolder `object-storage/`,
which the session puts on the class path rather than in `spark.jars` (`object_storage_jars`).
Nothing is downloaded at run time; a session without Delta's jars is refused.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from hashlib import sha256
from pathlib import Path

from streamjoin.errors import SetupError

RESOURCES = Path(__file__).resolve().parent / "resources"
POM = RESOURCES / "jvm-deps.xml"
OBJECT_STORAGE = "object-storage"  # the subfolder of the object storage connector's jars
# What set-up fetches: each POM's runtime dependencies into a folder below the jars folder.
PARTS = {".": POM, OBJECT_STORAGE: RESOURCES / "object-storage.xml"}
LOG4J = RESOURCES / "log4j2.properties"  # quiet Spark: the session points driver and executors here
CHECKOUT = Path(__file__).resolve().parent.parent  # the source checkout, when running from one
STAMP = ".fetched"  # holds the POM's hash: a folder fetched for another POM is fetched again
# The driver JVM's class archive (Java's class data sharing), made by `setup-jars` beside the jars:
# the classes a run loads, parsed and verified once, mapped by every later driver. A driver then
# starts and runs its first Delta write and read in about half the time (measured on 2 cores:
# 18.6 s and 33 CPU-s without it, 10.5 s and 19 CPU-s with it; 9 to 11 s and 12 to 15 CPU-s with
# it and C1 only), which every CLI command, DAG task and live runner pays at its start.
ARCHIVE = "driver-classes.jsa"
ARCHIVE_STAMP = ".archived"  # the runtime the archive was made for (`_runtime_hash`)
DUMP_CLASSES = "STREAMJOIN_DUMP_CLASSES"  # set by `build_class_archive` for the run that makes it
C1_ONLY = "-XX:TieredStopAtLevel=1"  # the JIT option of a JVM that runs too briefly for C2 to pay
JVM_OPTIONS = f"-Duser.timezone=UTC -Dlog4j2.configurationFile={LOG4J}"  # driver and executors


def checkout() -> Path | None:
    """The source checkout this package runs from (a clone, installed editable), or None for an
    installed package: where the checkout's folders (.jars/, jobs/, expectations/) are."""
    return CHECKOUT if (CHECKOUT / "pyproject.toml").is_file() else None


def folder() -> Path:
    """Where the jars are: $STREAMJOIN_JARS; else <checkout>/.jars when running from a source
    checkout (what infra/setup.sh fills); else ~/.cache/streamjoin/jars (an installed package)."""
    if os.environ.get("STREAMJOIN_JARS"):
        return Path(os.environ["STREAMJOIN_JARS"])
    root = checkout()
    return root / ".jars" if root else Path.home() / ".cache" / "streamjoin" / "jars"


def delta_jars() -> list[str]:
    """The fetched jars; refuses, saying how to fetch them, when Delta's are not there."""
    where = folder()
    jars = sorted(str(p) for p in where.glob("*.jar"))
    if not any(Path(j).name.startswith("delta-spark_") for j in jars):
        raise SetupError(
            f"Delta's jars are missing from {where}: run `streamjoin setup-jars` once to fetch them "
            "(Maven, from Maven Central), or point STREAMJOIN_JARS at a folder that holds them."
        )
    return jars


def object_storage_jars() -> list[str]:
    """The object storage connector's jars set-up fetched (none if it fetched none). The session
    adds them to the class path, not to `spark.jars`: the AWS SDK bundle alone is 650 MB, which
    Spark would copy into each executor's work folder (a local session's too) at its first task."""
    return sorted(str(p) for p in (folder() / OBJECT_STORAGE).glob("*.jar"))


def fetched(where: Path) -> bool:
    """The folder holds the jars of every shipped POM."""
    return all(_part_fetched(where / part, pom) for part, pom in PARTS.items())


def _part_fetched(where: Path, pom: Path) -> bool:
    stamp = where / STAMP
    return stamp.is_file() and stamp.read_text().strip() == _pom_hash(pom)


def fetch(where: Path, offline: bool = False, force: bool = False) -> list[Path]:
    """Resolve each shipped POM's runtime dependencies with Maven (`offline`: from the local
    repository only) into `where` (the object storage connector into its subfolder), without the
    jars pyspark ships; parts already fetched are left alone unless `force`. Returns the jars kept."""
    kept = []
    for part, pom in PARTS.items():
        if force or not _part_fetched(where / part, pom):
            kept += _fetch_part(pom, (where / part).resolve(), offline)
    return kept


def _fetch_part(pom: Path, where: Path, offline: bool) -> list[Path]:
    """One POM's jars into `where`: linked to Maven's local repository where it is on the same
    disk (the AWS SDK bundle is 650 MB), else copied."""
    provided = {_artifact(p.name) for p in _pyspark_jars()}
    resolved = [Path(p) for p in _resolve(pom, offline) if _artifact(Path(p).name) not in provided]
    where.mkdir(parents=True, exist_ok=True)
    for stale in where.glob("*.jar"):  # jars of an earlier POM; nothing else in the folder is touched
        stale.unlink()
    kept = []
    for jar in sorted(resolved, key=lambda p: p.name):
        try:
            os.link(jar, where / jar.name)
        except OSError:
            shutil.copy2(jar, where / jar.name)
        kept.append(where / jar.name)
    (where / STAMP).write_text(_pom_hash(pom))
    return kept


def _resolve(pom: Path, offline: bool) -> list[str]:
    """The paths, in Maven's local repository, of `pom`'s runtime dependencies; Hadoop's version
    is the one pyspark ships."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SetupError(
            "setup-jars needs Maven (`mvn`) on PATH, e.g. `apt-get install maven`; or copy Delta's jars "
            f"(the dependencies of {POM}) into a folder and point STREAMJOIN_JARS at it"
        )
    with tempfile.TemporaryDirectory() as scratch:
        listing = Path(scratch, "classpath")
        command = [mvn, "--batch-mode", "--quiet", *(["--offline"] if offline else []), "-f", str(pom)]
        command += [f"-Dhadoop.version={hadoop_version()}", "dependency:build-classpath"]
        command += ["-DincludeScope=runtime", f"-Dmdep.outputFile={listing}"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            output = (done.stdout + done.stderr)[-3000:]
            raise SetupError(
                f"Maven could not resolve the jars of {pom.name} ({' '.join(command)}):\n{output}"
            )
        return [p for p in listing.read_text().strip().split(os.pathsep) if p]


def hadoop_version() -> str:
    """The Hadoop version pyspark ships (its hadoop-client-api jar's): the object storage
    connector must be exactly that version."""
    for jar in _pyspark_jars():
        match = re.fullmatch(r"hadoop-client-api-(.+)\.jar", jar.name)
        if match:
            return match.group(1)
    raise SetupError("pyspark's jars hold no hadoop-client-api jar: reinstall pyspark")


def _pyspark_jars() -> list[Path]:
    import pyspark

    return sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))


def class_archive() -> Path | None:
    """The driver class archive beside the jars, if set-up made one. The JVM checks that it was
    made by the same Java for the same classpath and, if not, runs without it (silently: the
    session turns its messages off), so a stale archive costs nothing but the time it would save."""
    path = folder() / ARCHIVE
    return path if path.is_file() else None


def driver_java_options() -> str:
    """The driver JVM's options: UTC and quiet logging (as executors), the class archive set-up made
    (`class_archive`; the run that makes it is told to write it instead), then
    $STREAMJOIN_JAVA_OPTIONS. Java's messages about the archive are off: a stale one is skipped
    silently, and none of them reaches the output of a CLI command. The session gives them to the
    driver it launches; a driver spark-submit launches gets them from its caller (an Airflow
    task's `--conf`, dags/streamjoin_dags.py)."""
    options = [JVM_OPTIONS, "-Xlog:cds*=off"]
    dump, archive = os.environ.get(DUMP_CLASSES), class_archive()
    if dump:
        options.append(f"-XX:ArchiveClassesAtExit={dump}")
    elif archive is not None:
        options.append(f"-XX:SharedArchiveFile={archive}")
    options.append(os.environ.get("STREAMJOIN_JAVA_OPTIONS", ""))
    return " ".join(filter(None, options))


def submit_settings() -> tuple[list[str], dict[str, str], dict[str, str]]:
    """What `spark-submit` needs to start a streamjoin driver as the CLI starts one: Delta's jars
    (`--jars`); the driver's JVM options and, where set-up fetched the object storage connector,
    the connector on the executors' class path (`--conf`); and the connector on the driver's class
    path through $SPARK_DIST_CLASSPATH (the environment of spark-submit). A submitted driver's JVM
    runs before the session does, so the session cannot add the connector to it as it does for the
    driver it launches itself (both take it from `connector_class_path`)."""
    executors, driver_env = connector_class_path()
    return delta_jars(), {"spark.driver.extraJavaOptions": driver_java_options(), **executors}, driver_env


def connector_class_path() -> tuple[dict[str, str], dict[str, str]]:
    """The object storage connector (`object_storage_jars`) on the class paths: the executors'
    setting (`spark.executor.extraClassPath`), and the driver's environment ($SPARK_DIST_CLASSPATH
    as it is, with the connector appended unless it holds it), which Spark's launcher appends after
    its own jars. Both empty where set-up fetched no connector."""
    connector = os.pathsep.join(object_storage_jars())
    if not connector:
        return {}, {}
    given = os.environ.get("SPARK_DIST_CLASSPATH", "")
    dist = given if connector in given else os.pathsep.join(filter(None, (given, connector)))
    return {"spark.executor.extraClassPath": connector}, {"SPARK_DIST_CLASSPATH": dist}


def archive_current(where: Path) -> bool:
    """`where` holds a class archive made for this Java, pyspark and these jars."""
    stamp = where / ARCHIVE_STAMP
    return (
        (where / ARCHIVE).is_file() and stamp.is_file() and stamp.read_text().strip() == _runtime_hash(where)
    )


def build_class_archive(where: Path) -> Path:
    """Make the driver class archive in `where`: a child process runs a small replay and live run
    (`streamjoin.warmup`) with the JVM told to archive the classes it loaded when it exits.

    That JVM compiles with C1 alone: the archive holds classes, not compiled code, so it is the
    same, and a run of a minute spends a third of its CPU in C2 for code it will not reuse (57 s
    and 65 CPU-s instead of 61 s and 93; set-up runs it beside the checks)."""
    target, partial = where / ARCHIVE, where / f"{ARCHIVE}.partial"
    partial.unlink(missing_ok=True)
    options = f"{os.environ.get('STREAMJOIN_JAVA_OPTIONS', '')} {C1_ONLY}".strip()
    env = {
        **os.environ,
        DUMP_CLASSES: str(partial),
        "STREAMJOIN_JARS": str(where),
        "STREAMJOIN_JAVA_OPTIONS": options,
    }
    done = subprocess.run(
        [sys.executable, "-m", "streamjoin.warmup"], env=env, capture_output=True, text=True
    )
    if done.returncode != 0 or not partial.is_file():
        raise SetupError(
            f"could not make the driver class archive {target} (exit {done.returncode}); sessions start "
            f"without it, only slower. What the run said:\n{(done.stdout + done.stderr)[-3000:]}"
        )
    partial.replace(target)
    (where / ARCHIVE_STAMP).write_text(_runtime_hash(where))
    return target


def _runtime_hash(where: Path) -> str:
    """What an archive is valid for: the Java that runs the driver, pyspark's version, the jars."""
    import pyspark

    java = (
        Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    )
    jars = [p.name for p in _pyspark_jars()]
    jars += sorted(p.name for p in where.glob("*.jar"))
    facts = [os.path.realpath(java) if java else "no java", pyspark.__version__, *jars]
    return sha256("\n".join(facts).encode()).hexdigest()


def _artifact(file_name: str) -> str:
    """A jar's artifact name without its version: delta-storage-4.4.0.jar -> delta-storage."""
    return re.sub(r"-[0-9][A-Za-z0-9._-]*\.jar$", "", file_name)


def _pom_hash(pom: Path) -> str:
    return sha256(pom.read_bytes()).hexdigest()
