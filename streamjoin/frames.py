"""Small DataFrames made from Python rows, held in the query plan itself.

`spark.createDataFrame(rows, schema)` ships the rows as a pickled RDD, passed through a Python
worker and unpickled in the JVM by every query that reads them; Spark knows nothing of their size,
so a join with them shuffles and sorts both sides. Sent as Arrow, the same rows become a local
relation: the optimizer knows their size (a join broadcasts them) and folds filters and
projections over them into new local relations, and a write of them needs no Python worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType


def local_frame(spark: SparkSession, rows: Iterable[Sequence[Any]], schema: StructType | str) -> DataFrame:
    """`rows` (tuples or Rows in `schema`'s column order; a struct as a tuple) as a local relation,
    holding what `spark.createDataFrame(rows, schema)` would (a naive datetime is local time).
    `schema` may be a DDL string ("id string, t timestamp"), as createDataFrame takes it."""
    if isinstance(schema, str):
        parsed = StructType.fromDDL(schema)
        assert isinstance(parsed, StructType)  # a DDL list of columns parses to a struct
        schema = parsed
    arrow = to_arrow_schema(schema, timezone="UTC")
    columns = list(zip(*rows, strict=True)) or [() for _ in schema.fields]
    arrays = [
        pa.array([_arrow_value(value, column.type) for value in values], type=column.type)
        for values, column in zip(columns, arrow, strict=True)
    ]
    return spark.createDataFrame(pa.Table.from_arrays(arrays, schema=arrow), schema)


def _arrow_value(value: Any, kind: pa.DataType) -> Any:
    """`value` as Arrow takes it: a struct (a tuple or a Row) as a mapping of its fields; a naive
    datetime made aware in the machine's time zone, as pyspark reads one (Arrow would take UTC)."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.astimezone()
    if value is None or not pa.types.is_struct(kind):
        return value
    return {f.name: _arrow_value(part, f.type) for f, part in zip(kind, value, strict=True)}
