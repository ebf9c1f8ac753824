#!/usr/bin/env bash
# A Spark standalone cluster on this machine, on loopback: one master and one worker, run from the
# pyspark installed in .venv (nothing downloaded). Jobs reach it with
#   .venv/bin/streamjoin --master spark://127.0.0.1:7077 replay ...
#
#   infra/spark-cluster.sh start    start both, wait until the worker registered, print the master URL
#   infra/spark-cluster.sh stop     stop what `start` started (pid files); safe to repeat
#   infra/spark-cluster.sh status   say what runs; exit 0 only when master and worker both run
#
# Settings (environment, defaults in brackets):
#   STREAMJOIN_CLUSTER_HOST [127.0.0.1]        address master and worker bind to
#   STREAMJOIN_MASTER_PORT [7077]              master RPC port (the spark:// URL)
#   STREAMJOIN_MASTER_WEBUI_PORT [8080]        master web UI (its /json/ is polled)
#   STREAMJOIN_WORKER_PORT [7078]              worker RPC port
#   STREAMJOIN_WORKER_WEBUI_PORT [8081]        worker web UI
#   STREAMJOIN_WORKER_CORES [2]                cores the worker offers to executors
#   STREAMJOIN_WORKER_MEMORY [2g]              memory the worker offers to executors
#   STREAMJOIN_CLUSTER_DIR [<repo>/.cluster]   state: pid files, logs, the worker's work folder
#   STREAMJOIN_CLUSTER_TIMEOUT [90]            seconds `start` waits for the worker to register
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

host="${STREAMJOIN_CLUSTER_HOST:-127.0.0.1}"
master_port="${STREAMJOIN_MASTER_PORT:-7077}"
master_webui="${STREAMJOIN_MASTER_WEBUI_PORT:-8080}"
worker_port="${STREAMJOIN_WORKER_PORT:-7078}"
worker_webui="${STREAMJOIN_WORKER_WEBUI_PORT:-8081}"
worker_cores="${STREAMJOIN_WORKER_CORES:-2}"
worker_memory="${STREAMJOIN_WORKER_MEMORY:-2g}"
state="${STREAMJOIN_CLUSTER_DIR:-$root/.cluster}"
timeout="${STREAMJOIN_CLUSTER_TIMEOUT:-90}"

master_url="spark://$host:$master_port"
status_url="http://$host:$master_webui/json/"
declare -A main_class=(
  [master]=org.apache.spark.deploy.master.Master
  [worker]=org.apache.spark.deploy.worker.Worker
)

die() { echo "spark-cluster: $*" >&2; exit 1; }

spark_home() {
  local python="$root/.venv/bin/python"
  [ -x "$python" ] || die "no virtual environment at $root/.venv: run infra/setup.sh first"
  "$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))'
}

# The pid a daemon's pid file names, if that process still runs the daemon's class (not a reused pid).
running_pid() {
  local name="$1" file="$state/$1.pid" pid command
  [ -f "$file" ] || return 1
  pid="$(cat "$file")"
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  command="$(tr '\0' ' ' <"/proc/$pid/cmdline")"
  [[ "$command" == *"${main_class[$name]}"* ]] || return 1
  echo "$pid"
}

# Start one daemon in its own session, its pid written by the process that becomes the JVM.
launch() {
  local name="$1"; shift
  local home; home="$(spark_home)"
  SPARK_HOME="$home" SPARK_LOCAL_IP="$host" \
    setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' launch "$state/$name.pid" \
    "$home/bin/spark-class" "${main_class[$name]}" "$@" \
    >"$state/$name.log" 2>&1 </dev/null &
  # The pid file is written by the background process: wait for it, or a busy machine reads its
  # absence as an exit during start-up.
  local waited=0
  until [ -s "$state/$name.pid" ]; do
    [ "$waited" -lt 100 ] || die "the $name did not start within 10 s; its log: $state/$name.log"
    sleep 0.1
    waited=$((waited + 1))
  done
}

# The master's view as "<alive workers> <master url>", or nothing while it does not answer.
master_view() {
  curl --silent --fail --max-time 2 "$status_url" 2>/dev/null | "$root/.venv/bin/python" -c '
import json, sys
view = json.load(sys.stdin)
print(view.get("aliveworkers", 0), view.get("url", ""))' 2>/dev/null || true
}

stop_one() {
  local name="$1" pid
  if pid="$(running_pid "$name")"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
    echo "stopped $name (pid $pid)"
  fi
  rm -f "$state/$name.pid"
}

cmd_start() {
  mkdir -p "$state/work"
  if running_pid master >/dev/null && running_pid worker >/dev/null; then
    echo "already running: $master_url"
    return 0
  fi
  command -v java >/dev/null || [ -n "${JAVA_HOME:-}" ] || die "no java on PATH and JAVA_HOME unset: install a JDK 17"
  running_pid master >/dev/null ||
    launch master --host "$host" --port "$master_port" --webui-port "$master_webui"
  running_pid worker >/dev/null ||
    launch worker --host "$host" --port "$worker_port" --webui-port "$worker_webui" \
      --cores "$worker_cores" --memory "$worker_memory" --work-dir "$state/work" "$master_url"
  local deadline=$((SECONDS + timeout)) view
  while [ "$SECONDS" -lt "$deadline" ]; do
    view="$(master_view)"
    if [ -n "$view" ] && [ "${view%% *}" -ge 1 ]; then
      echo "${view#* }"
      return 0
    fi
    for name in master worker; do
      running_pid "$name" >/dev/null || {
        tail -n 20 "$state/$name.log" >&2 || true
        cmd_stop >/dev/null
        die "the $name exited during start-up; its log: $state/$name.log"
      }
    done
    sleep 1
  done
  cmd_stop >/dev/null
  die "no worker registered with $master_url within ${timeout}s; logs in $state (raise STREAMJOIN_CLUSTER_TIMEOUT or free the ports)"
}

cmd_stop() {
  stop_one worker
  stop_one master
}

cmd_status() {
  local up=0 name pid view
  for name in master worker; do
    if pid="$(running_pid "$name")"; then
      echo "$name: running (pid $pid, log $state/$name.log)"
      up=$((up + 1))
    else
      echo "$name: not running"
    fi
  done
  view="$(master_view)"
  if [ -n "$view" ]; then
    echo "master URL: ${view#* } (alive workers: ${view%% *}, web UI http://$host:$master_webui)"
  fi
  [ "$up" -eq 2 ]
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
