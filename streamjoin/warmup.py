"""The run whose loaded classes become the driver class archive (`jars.build_class_archive`).

    STREAMJOIN_DUMP_CLASSES=FILE python -m streamjoin.warmup

A session (its JVM told by `jars.driver_java_options` to archive its classes into FILE when
it exits) writes two small stream tables, replays a join of them and runs it live, so that the
classes of Delta's reads and writes, its change feed, planning, joins and Structured Streaming
are all loaded; then it stops and waits for its JVM to exit and write the archive.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from datetime import datetime, timedelta

from streamjoin.runners.live import LiveRunner
from streamjoin.runners.replay import replay
from streamjoin.session import get_spark
from streamjoin.spec import spec_from_dict

_SCHEMA = "id STRING, k STRING, t TIMESTAMP"
_START = datetime(2024, 1, 1)


def main() -> None:
    spark = get_spark(app_name="streamjoin-warmup")
    with tempfile.TemporaryDirectory(prefix="streamjoin-warmup-") as root:
        for name in ("l", "r"):
            rows = [(f"{name}{i}", "ab"[i % 2], _START + timedelta(seconds=3 * i)) for i in range(6)]
            spark.createDataFrame(rows, _SCHEMA).write.format("delta").save(f"{root}/{name}")
        spec = spec_from_dict(
            {
                "name": "warmup",
                "sources": {name: {"path": f"{root}/{name}", "time": "t"} for name in ("l", "r")},
                "from": "l",
                "joins": [{"join": "r", "type": "left", "on": "l.k = r.k", "between": ["-5s", "5s"]}],
                "select": ["l.id AS lid", "r.id AS rid"],
                "output": {"path": f"{root}/out"},
            }
        )
        replay(spark, spec, _START - timedelta(days=1), _START + timedelta(days=1))
        live = replace(spec, output=replace(spec.output, path=f"{root}/live"))
        LiveRunner(spark, live, f"{root}/checkpoint").run()
        gateway = spark.sparkContext._gateway
        spark.stop()
    # The JVM exits when its standard input closes (PythonGatewayServer) and writes the archive
    # as it exits: wait for that, not for this interpreter's own exit.
    process = getattr(gateway, "proc", None)
    if process is not None:
        process.stdin.close()
        process.wait(timeout=300)


if __name__ == "__main__":
    main()
