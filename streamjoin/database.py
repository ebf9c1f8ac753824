"""The external databases lookup joins read, through Spark's JDBC source (one place for them).

The JDBC driver of the database goes on Spark's classpath like Delta's jars (`.jars/`, which
`streamjoin setup-jars` fills: PostgreSQL's driver is there; others through `spark.jars`).
"""

from __future__ import annotations

import os

from pyspark.sql import DataFrame, SparkSession

from streamjoin.errors import JobError
from streamjoin.spec import Lookup


def table(spark: SparkSession, lookup: Lookup, where: str) -> DataFrame:
    """The database table as Spark reads it through JDBC: its schema is read now (a connection),
    its rows when an action runs. Refused, saying what to check, when it cannot be reached."""
    properties = {}
    if lookup.driver_class:
        properties["driver"] = lookup.driver_class
    if lookup.user:
        properties["user"] = lookup.user
    if lookup.password_env:
        password = os.environ.get(lookup.password_env)
        if password is None:
            raise JobError(
                f"{where}: the environment variable {lookup.password_env} (password_env) is not set; export the "
                f"password of {lookup.where} in it before running the job"
            )
        properties["password"] = password
    try:
        return spark.read.jdbc(lookup.url, lookup.table, properties=properties)
    except Exception as exc:  # the driver's or Spark's: a connection, a name, a driver not found
        java = getattr(exc, "java_exception", None)
        text = str(java.toString()) if java is not None else str(exc)
        message = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        raise JobError(
            f"{where}: cannot read {lookup.where} through JDBC ({message[:300]}); check that the database is up, "
            "the url, table, user and password_env, and that its JDBC driver is on Spark's classpath"
        ) from None
