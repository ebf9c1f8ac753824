"""One module per join family, each holding that family's whole semantics behind the operator
interface of `streamjoin.joins.base`; importing this package registers them all (every module of
the package is imported once: `streamjoin.family.families`)."""

from streamjoin import family
from streamjoin.joins.base import FAMILIES

family.families()

__all__ = ["FAMILIES"]
