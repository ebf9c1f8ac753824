#!/usr/bin/env bash
# Idempotent set-up of a fresh clone: virtual environment, Python packages, Delta's JVM jars.
# Every download happens here, once; afterwards nothing is fetched at run time or test time.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
stamp=.venv/.streamjoin-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[airflow,quality,dev,bench]"
  echo "$want" > "$stamp"
fi

# Delta's jars and their runtime dependencies, minus what pyspark already ships (by artifact
# name), so the classpath holds one version of each library: Spark's.
jars=.jars
jstamp="$jars/.fetched"
jwant="$(sha256sum infra/jvm-deps.xml | cut -d' ' -f1)"
if [ ! -f "$jstamp" ] || [ "$(cat "$jstamp")" != "$jwant" ]; then
  rm -rf "$jars" "$jars.all"
  mvn --batch-mode --quiet -f infra/jvm-deps.xml dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$root/$jars.all"
  mkdir -p "$jars"
  spark_jars="$(.venv/bin/python -c 'import pyspark, os; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')"
  strip() { sed -E 's/-[0-9][A-Za-z0-9._-]*\.jar$//'; }
  provided="$(ls "$spark_jars" | strip | sort -u)"
  for jar in "$jars.all"/*.jar; do
    name="$(basename "$jar" | strip)"
    grep -qxF "$name" <<<"$provided" || cp "$jar" "$jars/"
  done
  rm -rf "$jars.all"
  echo "$jwant" > "$jstamp"
fi

# Debian's chromium and its driver, for the report's browser test (tests/test_report.py).
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi
