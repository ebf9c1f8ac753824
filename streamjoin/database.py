"""The external databases lookup joins read, through Spark's JDBC source (one place for them).

The JDBC driver of the database goes on Spark's classpath like Delta's jars (`.jars/`, which
`streamjoin setup-jars` fills: PostgreSQL's driver is there; others through `spark.jars`).

A job connects only when it must ask: a replay of commits whose answers the journal holds reads
the table's columns from the journal and needs no database (docs/semantics.md, "Lookup joins").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamjoin.errors import JobError
from streamjoin.links import NAME

if TYPE_CHECKING:  # `Lookup` is read with the job, without Spark; the functions run with it
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

# The driver class of the databases whose JDBC URL names them (jdbc:<name>:...).
JDBC_DRIVERS = {
    "postgresql": "org.postgresql.Driver",
    "mysql": "com.mysql.cj.jdbc.Driver",
    "mariadb": "org.mariadb.jdbc.Driver",
    "sqlite": "org.sqlite.JDBC",
    "sqlserver": "com.microsoft.sqlserver.jdbc.SQLServerDriver",
    "oracle": "oracle.jdbc.OracleDriver",
}


@dataclass(frozen=True)
class Lookup:
    """An external database table a lookup join reads through JDBC (Flink's JDBC lookup source):
    `url` (jdbc:postgresql://host:port/db), the `table` in it, and credentials: `user`, and the
    name of an environment variable holding the password (never the password itself)."""

    url: str
    table: str
    user: str | None = None
    password_env: str | None = None
    driver: str | None = None  # the JDBC driver class; default: the one the URL's database ships

    def __post_init__(self) -> None:
        if not str(self.url).startswith("jdbc:"):
            raise JobError(
                f"lookup url {self.url!r} is not a JDBC URL; write e.g. url: jdbc:postgresql://127.0.0.1:5432/shop"
            )
        if not self.table:
            raise JobError("lookup: give the database table to look rows up in, e.g. table: customers")
        if self.password_env is not None and not NAME.match(self.password_env):
            raise JobError(
                f"lookup password_env {self.password_env!r} must name an environment variable (e.g. SHOP_PASSWORD), "
                "not hold the password"
            )

    @property
    def driver_class(self) -> str | None:
        """`driver`, else the usual driver of the URL's database (Spark finds no driver loaded from
        spark.jars by URL alone)."""
        if self.driver:
            return self.driver
        kind = self.url.split(":", 2)[1] if self.url.count(":") >= 2 else ""
        return JDBC_DRIVERS.get(kind)

    @property
    def where(self) -> str:
        """The table and database, for messages (without the URL's parameters, which may hold secrets)."""
        return f"{self.table} at {self.url.split('?', 1)[0]}"

    def plain(self) -> dict[str, str]:
        """As a link's setting reads as data (`links.plain`): the URL without its parameters."""
        return {"table": self.table, "url": self.url.split("?", 1)[0]}


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


def columns(spark: SparkSession, lookup: Lookup, where: str, journal: str) -> StructType:
    """The database table's columns as the job sees them: those of the rows its journal recorded
    (no connection: a replay of recorded commits runs while the database is down), else read from
    the database now (a connection, refused when it cannot be reached)."""
    from pyspark.sql.types import ArrayType, StructType

    from streamjoin import delta_io

    if delta_io.exists(spark, journal):
        recorded = delta_io.schema(spark, journal)["rows"].dataType
        if isinstance(recorded, ArrayType) and isinstance(recorded.elementType, StructType):
            return recorded.elementType
    return table(spark, lookup, where).schema


def asked(spark: SparkSession, lookup: Lookup, where: str, made: StructType) -> DataFrame:
    """The database table to ask now (`table`), refused when it no longer has a column the job
    reads (as its journal recorded it) with that column's type."""
    found = table(spark, lookup, where)
    have = {f.name: f.dataType for f in found.schema.fields}
    changed = [f"{f.name} {f.dataType.simpleString()}" for f in made.fields if have.get(f.name) != f.dataType]
    if changed:
        raise JobError(
            f"{where}: {lookup.where} no longer has the column(s) {', '.join(changed)} that the job's journal "
            f"recorded answers with (it has {', '.join(f'{n} {t.simpleString()}' for n, t in have.items())}); "
            "restore them, or write the job to a new output, whose journal starts from the table as it is"
        )
    return found
