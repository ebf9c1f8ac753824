"""The Python table functions that jobs name (`function: module:attribute`), loaded and checked.

A table-function join (Flink's LATERAL TABLE) calls a Spark Python UDTF on each stream row. The
runners call it through `numbered`, which numbers the rows a call makes and makes one empty row
for a call that makes none, so that one pass tells joined rows from rows to pad or drop.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from typing import Any

from pyspark import cloudpickle
from pyspark.sql.functions import udtf
from pyspark.sql.types import IntegerType, StructField, StructType
from pyspark.sql.udtf import UserDefinedTableFunction

from streamjoin.errors import JobError

ORDINAL = "_sj_ordinal"  # a made row's number among its call's rows, from 0; NULL: the call made none


def load(reference: str, where: str) -> UserDefinedTableFunction:
    """The UDTF `module:attribute` names, refused with what to change unless it is a Spark Python
    UDTF with a fixed return type and no `terminate` (whose rows belong to no row). Spark takes
    every UDTF for non-deterministic; a replay equals the live run only for a function of its
    arguments alone (docs/job-spec.md)."""
    module_name, _, attribute = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import failure is the job's to fix
        raise JobError(
            f"{where}: cannot import module {module_name!r} of function {reference!r} ({type(exc).__name__}: "
            f"{exc}); put it on PYTHONPATH or install its package"
        ) from None
    function = getattr(module, attribute, None)
    if function is None:
        raise JobError(f"{where}: module {module_name!r} has no {attribute!r}; check the function's name")
    if not isinstance(function, UserDefinedTableFunction):
        raise JobError(
            f"{where}: {reference} is a {type(function).__name__}, not a Spark Python table function; "
            "decorate its class with @pyspark.sql.functions.udtf(returnType='word: string, ...')"
        )
    if not isinstance(function.returnType, StructType):
        raise JobError(
            f"{where}: {reference} decides its columns with analyze(); give it a fixed returnType so that "
            "a job's columns are known before data moves"
        )
    if hasattr(function.func, "terminate"):
        raise JobError(
            f"{where}: {reference} has terminate(), whose rows belong to no stream row; make every row in eval()"
        )
    file = getattr(module, "__file__", None) or ""
    if "site-packages" not in file and "dist-packages" not in file:
        # Spark's Python workers may not see the job's own modules: ship them with the function.
        cloudpickle.register_pickle_by_value(sys.modules[module_name.partition(".")[0]])
    return function


def numbered(
    function: UserDefinedTableFunction, reference: str, columns: tuple[str, ...]
) -> UserDefinedTableFunction:
    """`function` whose rows lead with their number in the call (`ORDINAL`), named `columns`; a call
    that makes no row makes one with ORDINAL NULL. A failing call names the function and its
    arguments."""
    inner, returned = function.func, function.returnType
    assert isinstance(returned, StructType)  # `load` refuses functions without a fixed return type
    fields = [StructField(n, f.dataType, True) for n, f in zip(columns, returned.fields, strict=True)]
    width = len(fields)

    class Numbered:
        def __init__(self) -> None:
            self._inner = inner()

        def eval(self, *args: Any) -> Iterator[tuple]:
            made = 0
            try:
                for row in self._inner.eval(*args) or ():
                    yield (made, *(row if isinstance(row, (tuple, list)) else (row,)))
                    made += 1
            except Exception as exc:
                raise RuntimeError(
                    f"table function {reference} failed on arguments {args!r}: {type(exc).__name__}: {exc}"
                ) from exc
            if not made:
                yield (None,) * (width + 1)

    schema = StructType([StructField(ORDINAL, IntegerType(), True), *fields])
    made = udtf(Numbered, returnType=schema)
    assert isinstance(made, UserDefinedTableFunction)  # udtf given a class returns the function
    return made
