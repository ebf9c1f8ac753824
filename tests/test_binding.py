"""Binding against an in-memory catalog: schemas given as StructTypes, no Spark, no database,
no user code imported; what the job refuses is refused in the same words as against Delta."""

from __future__ import annotations

import pytest
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType, TimestampType

from streamjoin.catalog import MemoryCatalog
from streamjoin.errors import JobError
from streamjoin.plan import bind, describe
from streamjoin.spec import spec_from_dict

ORDERS = StructType(
    [
        StructField("id", StringType()),
        StructField("customer", LongType()),
        StructField("tags", ArrayType(StringType())),
        StructField("t", TimestampType()),
    ]
)
CUSTOMERS = StructType([StructField("id", LongType()), StructField("country", StringType())])
WORDS = StructType([StructField("word", StringType()), StructField("position", LongType())])
CATALOG = MemoryCatalog(
    {"orders": ORDERS},
    databases={"customers at jdbc:postgresql://db:5432/shop": CUSTOMERS},
    functions={"words:split": WORDS},
)


def one_join(join: dict, select: list[str], where: str | None = None):
    document = {
        "name": "j",
        "sources": {"orders": {"path": "orders", "time": "t"}},
        "from": "orders",
        "joins": [join],
        "select": select,
        "output": {"path": "out"},
    }
    return spec_from_dict({**document, **({"where": where} if where else {})})


def test_a_lookup_binds_to_the_database_columns_the_catalog_answers():
    """No connection: the catalog answers the table's columns; the condition splits into the key
    and the rest, and the output columns follow the select list."""
    spec = one_join(
        {
            "lookup": {"url": "jdbc:postgresql://db:5432/shop?ssl=true", "table": "customers"},
            "as": "c",
            "on": "orders.customer = c.id AND c.country <> 'FR'",
        },
        ["orders.id", "c.country"],
    )
    (join,) = bind(CATALOG, spec).joins
    assert join.made == CUSTOMERS and join.equi == (("orders.customer", "c.id"),)
    assert join.residual == "(c.country <> 'FR')"
    assert "JOIN customers at jdbc:postgresql://db:5432/shop AS c(id bigint, country string) [lookup]" in (
        describe(bind(CATALOG, spec))
    )


def test_unnest_and_function_joins_make_the_columns_the_catalog_types():
    """An array column's elements, renamed by `columns`; a table function's declared columns
    (nothing imported)."""
    unnest = one_join({"unnest": "tags", "as": "m", "columns": ["tag"]}, ["orders.id", "m.tag"])
    (join,) = bind(CATALOG, unnest).joins
    assert join.made == StructType([StructField("tag", StringType())]) and join.made_from == ("orders.tags",)
    called = one_join({"function": "words:split", "args": ["id"], "as": "w"}, ["w.word", "w.position"])
    plan = bind(CATALOG, called)
    assert plan.joins[0].made == WORDS and plan.output_columns == ("word", "position")
    with pytest.raises(JobError, match="unnest 'id' is a string; UNNEST expands an array or a map"):
        bind(CATALOG, one_join({"unnest": "id", "as": "m"}, ["m.element"]))


def test_a_column_no_source_has_is_refused_where_it_stands():
    spec = one_join({"unnest": "tags", "as": "m"}, ["orders.id"], where="nope > 1")
    with pytest.raises(JobError) as error:
        bind(CATALOG, spec)
    assert str(error.value).startswith(
        "job 'j': where (nope > 1) does not resolve against the sources' columns: column nope cannot be resolved"
    )
    with pytest.raises(JobError, match=r'^job .j., select: "REFLECT\(.*" calls REFLECT, which runs any Java'):
        bind(CATALOG, one_join({"unnest": "tags", "as": "m"}, ["REFLECT('java.lang.Math', 'abs', 1)"]))
