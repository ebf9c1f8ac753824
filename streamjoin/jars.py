"""Delta's JVM jars: where the session factory finds them, and fetching them once (`setup-jars`).

pyspark ships Spark's jars but not Delta's. Set-up resolves Delta and its runtime dependencies
with Maven from the POM shipped in this package (resources/jvm-deps.xml) and keeps the jars
pyspark does not already ship (by artifact name), so the classpath holds one version of each
library: Spark's. Nothing is downloaded at run time; a session without the jars is refused.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from hashlib import sha256
from pathlib import Path

from streamjoin.errors import SetupError

RESOURCES = Path(__file__).resolve().parent / "resources"
POM = RESOURCES / "jvm-deps.xml"
LOG4J = RESOURCES / "log4j2.properties"  # quiet Spark: the session points driver and executors here
CHECKOUT = Path(__file__).resolve().parent.parent  # the source checkout, when running from one
STAMP = ".fetched"  # holds the POM's hash: a folder fetched for another POM is fetched again


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


def fetched(where: Path) -> bool:
    """The folder holds the jars of the shipped POM."""
    stamp = where / STAMP
    return stamp.is_file() and stamp.read_text().strip() == _pom_hash()


def fetch(where: Path, offline: bool = False) -> list[Path]:
    """Resolve the shipped POM's runtime dependencies with Maven (`offline`: from the local
    repository only) into `where`, without the jars pyspark ships; returns the jars kept."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SetupError(
            "setup-jars needs Maven (`mvn`) on PATH, e.g. `apt-get install maven`; or copy Delta's jars "
            f"(the dependencies of {POM}) into a folder and point STREAMJOIN_JARS at it"
        )
    import pyspark

    provided = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    with tempfile.TemporaryDirectory() as resolved:
        command = [mvn, "--batch-mode", "--quiet", *(["--offline"] if offline else []), "-f", str(POM)]
        command += ["dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={resolved}"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            output = (done.stdout + done.stderr)[-3000:]
            raise SetupError(f"Maven could not resolve Delta's jars ({' '.join(command)}):\n{output}")
        where.mkdir(parents=True, exist_ok=True)
        for stale in where.glob("*.jar"):  # jars of an earlier POM; nothing else in the folder is touched
            stale.unlink()
        kept = []
        for jar in sorted(Path(resolved).glob("*.jar")):
            if _artifact(jar.name) not in provided:
                kept.append(Path(shutil.copy2(jar, where / jar.name)))
    (where / STAMP).write_text(_pom_hash())
    return kept


def _artifact(file_name: str) -> str:
    """A jar's artifact name without its version: delta-storage-4.4.0.jar -> delta-storage."""
    return re.sub(r"-[0-9][A-Za-z0-9._-]*\.jar$", "", file_name)


def _pom_hash() -> str:
    return sha256(POM.read_bytes()).hexdigest()
