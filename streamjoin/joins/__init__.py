"""One module per join family, each holding that family's whole semantics behind the operator
interface of `streamjoin.joins.base`; importing this package registers them all."""

from streamjoin.joins import chain, interval, lateral, lookup, rows, table_table, temporal, window
from streamjoin.joins.base import FAMILIES

__all__ = ["FAMILIES", "chain", "interval", "lateral", "lookup", "rows", "table_table", "temporal", "window"]
