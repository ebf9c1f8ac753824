#!/usr/bin/env bash
# Idempotent set-up of a fresh clone: virtual environment, Python packages, Delta's JVM jars.
# Every download happens here, once; afterwards nothing is fetched at run time or test time.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3

if [ ! -x .venv/bin/python ]; then
  # Without pip: uv installs everything, and a venv with pip took 5.4 s to make instead of 0.4.
  "$python" -m venv --without-pip .venv
fi
stamp=.venv/.streamjoin-installed
want="$(cat pyproject.toml infra/constraints.txt infra/overrides.txt | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # uv installs the 167 packages in about 30 s once its cache holds them, where pip took 68 s at
  # every set-up of a clone; infra/constraints.txt fixes every version, so the set is the same
  # (`make constraints` installs without them, STREAMJOIN_UNPINNED=1, and writes the new set).
  pins=(--constraint infra/constraints.txt)
  [ -z "${STREAMJOIN_UNPINNED:-}" ] || pins=()
  # uv itself, by the interpreter's own pip when it has one (pip 22.3 or later installs into
  # another environment), else by a pip bootstrapped into the venv.
  uv_install=(install --quiet --disable-pip-version-check "uv==0.13.9")
  if ! "$python" -m pip --python .venv/bin/python "${uv_install[@]}" >/dev/null 2>&1; then
    .venv/bin/python -m ensurepip --default-pip >/dev/null
    .venv/bin/python -m pip "${uv_install[@]}"
  fi
  # Installed files are hard links into uv's cache (uv's default), not copies: 2.4 s instead of
  # 10.4 s for a fresh clone (twice a CI run). Nothing writes to an installed file in place:
  # installers replace files, and compiled bytecode goes to new files beside them.
  # infra/overrides.txt drops what a dependency declares but must not be installed (pyspark-client,
  # which would overwrite pyspark's own files).
  UV_LINK_MODE=hardlink .venv/bin/uv pip install --quiet --python .venv/bin/python "${pins[@]}" \
    --overrides infra/overrides.txt -e ".[airflow,quality,dev,bench]"
  # uv keeps every revision of a source distribution it builds, and where the package index's
  # answers cannot be cached it makes a new one at each set-up of a clone: a 1.4 GB pyspark build
  # each time (64 of them, 58 GB, filled this machine's disk on 2026-11-29, and mypy then failed
  # for want of space). pyproject.toml now tells uv that PyPI's files never change, so it keeps
  # one build; the revisions nothing points to any more still go.
  .venv/bin/uv cache prune --quiet
  echo "$want" > "$stamp"
fi

# Every installed module compiled once, for the packages installed (15 s on two cores;
# STREAMJOIN_NO_BYTECODE=1 skips it; STREAMJOIN_BYTECODE_JOBS=1 compiles in one process, as `make
# test` does beside the class archive). Where PYTHONDONTWRITEBYTECODE is set, as on the machine CI
# runs on, Python never caches what it compiles, so each process would compile pyspark, pandas,
# Airflow and Great Expectations again: importing Airflow's models took 5.6 s instead of 1.9, a
# live runner's modules 2.3 s instead of 1.0. A file that does not compile (a package may ship
# templates) is left to the import.
compiled=.venv/.streamjoin-compiled
if [ -z "${STREAMJOIN_NO_BYTECODE:-}" ] && [ "$(cat "$compiled" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m compileall -q -j "${STREAMJOIN_BYTECODE_JOBS:-0}" .venv/lib >/dev/null || true
  echo "$want" > "$compiled"
fi

# Delta's jars and their runtime dependencies, minus what pyspark already ships, into .jars/
# (streamjoin/jars.py; a folder that holds the jars of the shipped POM is left as it is), and the
# driver class archive beside them (a minute, once; STREAMJOIN_NO_CLASS_ARCHIVE=1 skips it).
.venv/bin/streamjoin setup-jars --dir "$root/.jars" ${STREAMJOIN_NO_CLASS_ARCHIVE:+--no-class-archive} >/dev/null

# S3Proxy, the S3-compatible server the object storage tests start on loopback
# (tests/s3server.py), one self-contained jar from Maven Central into .s3proxy/ (git-ignored).
s3proxy=org.gaul:s3proxy:4.1.0:jar:jar-with-dependencies
if [ "$(cat .s3proxy/.fetched 2>/dev/null)" != "$s3proxy" ]; then
  mvn --batch-mode --quiet dependency:copy -Dartifact="$s3proxy" -DoutputDirectory="$root/.s3proxy" >/dev/null
  echo "$s3proxy" > .s3proxy/.fetched
fi

# The styles and scripts Great Expectations' Data Docs pages load from CDNs, pinned, from npm's
# registry into .docs-assets/ (streamjoin/datadocs.py), so the pages work offline.
.venv/bin/streamjoin setup-docs-assets --dir "$root/.docs-assets" >/dev/null

# Debian's packages the tests start on loopback: chromium and its driver (the report's browser
# test, tests/test_report.py) and PostgreSQL (the lookup joins' database, tests/postgres.py).
packages=""
{ [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; } || packages="chromium chromium-driver"
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || packages="$packages postgresql"
if [ -n "$packages" ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  # shellcheck disable=SC2086  # the package list splits on purpose
  $sudo apt-get install -y -qq --no-install-recommends $packages >/dev/null
fi
