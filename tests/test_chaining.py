"""Chains as a fold over declared links (streamjoin/joins/chaining.py): what may follow what is each
family's declaration, the refusal of a job whose joins do not chain says it from those
declarations, the fold names no family, and no family extends another. Pure: no Spark."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from streamjoin import family
from streamjoin.joins import chain, chaining
from streamjoin.joins.base import JoinOperator


def test_the_refusal_says_what_each_family_takes_after_its_own():
    """Today's chains, as the declarations state them: stream-stream links after a stream-stream
    link, enrichment links after either, one stream-stream link after table links at the start,
    tables after tables, and nothing after the other families."""
    said = chaining.chains()
    assert (
        "after an interval join, an interval join (not CROSS), or a stream-table, temporal or asof join"
        in said
    )
    assert (
        "after an asof, stream-table or temporal join, a stream-table, temporal or asof join, or at a "
        "chain's start, an interval join (keyed, with final emission) that ends the chain" in said
    )
    assert "after a table-table join, a table-table join (INNER or LEFT" in said
    assert said.endswith("after a function, lookup, rows, unnest or window join, none yet")


def test_a_declaration_is_what_the_refusal_says(monkeypatch):
    """A family that declares what it takes is named by the refusal with it, and no longer among
    those that take nothing: the message is built from the declarations, not written apart."""
    rule = chaining.Accepts(("window",), when="TUMBLE only")
    monkeypatch.setitem(chaining.DECLARED, "window", chaining.Declaration((rule,)))
    said = chaining.chains()
    assert "after a window join, a window join (TUMBLE only)" in said
    assert said.endswith("after a function, lookup, rows or unnest join, none yet")


def test_a_rule_for_the_chains_start_takes_nothing_later():
    """`at_start` rules apply only right after a link that reads a source."""
    declared = chaining.DECLARED["stream-table"]
    (interval_rule,) = [rule for rule in declared.accepts if "interval" in rule.families]
    assert interval_rule.at_start and interval_rule.last


def test_the_chain_names_no_family_and_no_family_extends_another():
    """`joins/chain.py` reaches the families only through the link interface (its code names
    none of them), and a family reuses another's machinery by calling it, not by subclassing its
    operator (a new family never edits its parent)."""
    family_name = re.compile(
        r"interval|window|temporal|enrich|lateral|lookup|unnest|table_?table|rows_?join", re.IGNORECASE
    )
    tree = ast.parse(Path(chain.__file__).read_text())
    named = {
        name
        for node in ast.walk(tree)
        for name in (getattr(node, "id", None), getattr(node, "attr", None), getattr(node, "module", None))
        if isinstance(name, str) and family_name.search(name)
    }
    assert named == set()
    operators = {builder.__self__ for builder in family.operators().values()}  # each registers its `build`
    for operator in operators:
        assert [base for base in operator.__mro__[1:] if base in operators] == [], operator
        assert JoinOperator in operator.__mro__
