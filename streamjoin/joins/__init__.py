"""The join families, one package each, and the machinery they share (the plain modules).

A family's package declares it in its `__init__`, which imports no Spark: its link, the keys and
SQL syntax that give it, its binding and explain text, registered with `streamjoin.family`, which
imports every package here once. Its `step` module runs it on Spark behind the operator
interface of `streamjoin.joins.base`, imported when a run first needs an operator.
"""
