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

# Delta's jars and their runtime dependencies, minus what pyspark already ships, into .jars/
# (streamjoin/jars.py; a folder that holds the jars of the shipped POM is left as it is).
.venv/bin/streamjoin setup-jars --dir "$root/.jars" >/dev/null

# Debian's chromium and its driver, for the report's browser test (tests/test_report.py).
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi
