"""What a job file may not do, so that a hostile or broken one is refused in one line before it
exhausts the parsers' stack or the memory, writes columns Delta refuses, or calls arbitrary Java.

Every YAML job file is read by `load_yaml` (nesting, aliases and duplicate keys limited), every
expression and SQL job file is measured by `check_nesting` before a parser sees it, and
streamjoin/plan.py refuses output column names Delta refuses (`check_output_names`) and
expressions that call Java by reflection (`calls_java`). The rules: docs/job-spec.md, "Limits".
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlglot
import yaml
from sqlglot.tokens import TokenType

from streamjoin.errors import JobError

if TYPE_CHECKING:  # spec.py reads job files with this module, and Airflow parses DAGs without Spark
    from pyspark.sql import DataFrame

# Levels of parentheses, brackets, braces, CASE ... END and NOT one expression (or SQL statement)
# may nest: the SQL parser recurses once per level and gives out near 49 parentheses.
MAX_NESTING = 20
# Levels of mappings and lists a YAML job file may nest, aliases expanded (a job needs 5).
MAX_YAML_DEPTH = 20
# What the aliases (`*name`) of a YAML job file may add once expanded: a few shared settings
# repeated in every source are hundreds; eight nested anchors are hundreds of millions.
MAX_ALIAS_VALUES = 10_000
MAX_ALIAS_CHARACTERS = 100_000
# The characters Delta refuses in a column name unless the table maps its columns by name.
DELTA_REFUSED_CHARACTERS = " ,;{}()\n\t="

# What opens a level, and what closes it (a closer that closes nothing open is not counted).
_CLOSERS = {
    TokenType.L_PAREN: TokenType.R_PAREN,
    TokenType.L_BRACKET: TokenType.R_BRACKET,
    TokenType.L_BRACE: TokenType.R_BRACE,
    TokenType.CASE: TokenType.END,
}
_PREFIXES = {TokenType.NOT, TokenType.TILDE}  # NOT NOT x nests as (NOT (NOT x)); `!` reads as NOT
# Spark's expressions that call any Java method the job names: reflect and java_method
# (CallMethodViaReflection) and try_reflect (TryReflect, which holds one).
_JAVA_CALLS = {
    "org.apache.spark.sql.catalyst.expressions.TryReflect": "try_reflect",
    "org.apache.spark.sql.catalyst.expressions.CallMethodViaReflection": "reflect",
}
JAVA_CALLS_BY_NAME = ("try_reflect", "java_method", "reflect")  # the SQL functions that reach them
_JAVA_CALL_NAMES = re.compile(rf"\b({'|'.join(JAVA_CALLS_BY_NAME)})\b", re.IGNORECASE)


def nesting(text: str, dialect: Any = "spark") -> int:
    """How deep `text` nests: parentheses, brackets, braces, CASE ... END and runs of NOT, counted
    together over the tokens of `dialect` (strings, quoted names and names after a dot, such as
    `t.end`, are not counted); 0 when it does not tokenize (its parser then says where)."""
    try:
        tokens = sqlglot.tokenize(text, read=dialect)
    except sqlglot.errors.TokenError:
        return 0
    awaited: list[TokenType] = []  # the closer of each level open
    deepest = prefixes = 0
    for index, token in enumerate(tokens):
        named = index > 0 and tokens[index - 1].token_type == TokenType.DOT
        kind = None if named else token.token_type
        prefixes = prefixes + 1 if kind in _PREFIXES else 0
        if kind in _CLOSERS:
            awaited.append(_CLOSERS[kind])
        elif awaited and kind == awaited[-1]:
            awaited.pop()
        deepest = max(deepest, len(awaited) + prefixes)
    return deepest


def check_nesting(text: str, where: str, dialect: Any = "spark") -> None:
    """Refuse an expression or SQL job nested deeper than MAX_NESTING, before a parser recurses."""
    depth = nesting(text, dialect)
    if depth > MAX_NESTING:
        raise JobError(
            f"{where} nests {depth} levels deep (parentheses, brackets, CASE ... END and NOT counted "
            f"together); the limit is {MAX_NESTING}: remove redundant parentheses or split the expression "
            '(docs/job-spec.md, "Limits")'
        )


def check_output_names(columns: list[str], where: str) -> None:
    """Refuse an output column whose name holds a character Delta refuses in column names."""
    for column in columns:
        refused = [c for c in DELTA_REFUSED_CHARACTERS if c in column]
        if refused:
            shown = " ".join(repr(c) for c in refused)
            raise JobError(
                f"{where}: output column {column!r} holds {shown}, which Delta refuses in a column name "
                f"(any of {DELTA_REFUSED_CHARACTERS!r}); give that select item an alias of letters, digits "
                f"and _, e.g. ... AS {re.sub(r'[^A-Za-z0-9_]+', '_', column).strip('_') or 'value'}"
            )


def calls_java(frame: DataFrame, texts: Sequence[str]) -> tuple[str, str] | None:
    """(expression, function) when the analysed plan of `frame` calls a Java method the job names
    (reflect, java_method, try_reflect, however spelt or reached, IDENTIFIER('reflect') too): the
    first of `texts` that names the function, and the name as it spells it (else all of `texts`
    and Spark's name); None when it calls none."""
    analysed = frame._jdf.queryExecution().analyzed().toJSON()
    found = sorted({_JAVA_CALLS[c] for c in _classes(json.loads(analysed)) if c in _JAVA_CALLS})
    if not found:
        return None
    for text in texts:
        spelt = _JAVA_CALL_NAMES.search(text)
        if spelt:
            return text, spelt.group(0)
    return ", ".join(texts), found[-1]


def _classes(tree: Any) -> set[str]:
    """Every `class` a plan's JSON names, walked without recursion."""
    classes, pending = set(), [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if isinstance(node.get("class"), str):
                classes.add(node["class"])
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return classes


def load_yaml(text: str, origin: str) -> Any:
    """A YAML job file's document, read with the limits of `_JobLoader`; JobError when it is not
    valid YAML or breaks a limit."""
    loader = _JobLoader(text, origin)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise JobError(f"job file {origin!r} is not valid YAML: {exc}") from None
    finally:
        loader.dispose()


class _JobLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses, with the line: nesting deeper than MAX_YAML_DEPTH
    (aliases expanded), aliases that expand beyond MAX_ALIAS_VALUES values or
    MAX_ALIAS_CHARACTERS characters, an alias inside the value it names, and a key given twice
    in one mapping (YAML keeps the last one silently)."""

    def __init__(self, text: str, origin: str) -> None:
        super().__init__(text)
        self.origin = origin
        self.open_anchors: list[str] = []  # anchors of the collections being composed
        self.depth = 0
        self.alias_values = self.alias_characters = 0
        self.sizes: dict[int, tuple[int, int, int]] = {}  # id(node) -> (values, characters, depth)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._charge_alias(event)
            return super().compose_node(parent, index)
        self.depth += 1
        if self.depth > MAX_YAML_DEPTH:
            self._refuse(event, f"mappings and lists nest deeper than {MAX_YAML_DEPTH} levels")
        self.open_anchors.append(event.anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1
            self.open_anchors.pop()

    def _charge_alias(self, event: yaml.AliasEvent) -> None:
        """Count what an alias repeats against the budget, and the depth it reaches."""
        if event.anchor in self.open_anchors:
            self._refuse(event, f"alias *{event.anchor} sits inside the value &{event.anchor} names, a cycle")
        node = self.anchors.get(event.anchor)
        if node is None:
            return  # PyYAML refuses an undefined alias with its line
        values, characters, depth = self._size(node)
        self.alias_values += values
        self.alias_characters += characters
        if self.depth + depth > MAX_YAML_DEPTH:
            self._refuse(
                event,
                f"alias *{event.anchor} makes mappings and lists nest deeper than {MAX_YAML_DEPTH} levels",
            )
        if self.alias_values > MAX_ALIAS_VALUES or self.alias_characters > MAX_ALIAS_CHARACTERS:
            self._refuse(
                event,
                f"alias *{event.anchor} takes what the aliases repeat past {MAX_ALIAS_VALUES:,} values or "
                f"{MAX_ALIAS_CHARACTERS:,} characters of text; repeat less, or write the settings out",
            )

    def _size(self, node: yaml.Node) -> tuple[int, int, int]:
        """(values, characters, depth) of a composed node with its aliases expanded, remembered
        per node (an alias of an alias costs one look-up)."""
        known = self.sizes.get(id(node))
        if known is not None:
            return known
        if isinstance(node, yaml.ScalarNode):
            size = (1, len(node.value), 0)
        else:
            children = [
                self._size(child)
                for item in node.value
                for child in (item if isinstance(item, tuple) else (item,))
            ]
            size = (
                1 + sum(c[0] for c in children),
                sum(c[1] for c in children),
                1 + max((c[2] for c in children), default=0),
            )
        self.sizes[id(node)] = size
        return size

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """A mapping, refused when it gives one key twice (keys a merge `<<` brings may be
        overridden, as YAML's merge means)."""
        lines: dict[tuple[type, Any], int] = {}
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                continue
            line = key_node.start_mark.line + 1
            if (type(key), key) in lines:
                raise JobError(
                    f"job file {self.origin!r}: key {key_node.value!r} is given twice in one mapping, on line "
                    f"{lines[type(key), key]} and line {line}; keep one (YAML would keep the last silently)"
                )
            lines[type(key), key] = line
        return super().construct_mapping(node, deep)

    def _refuse(self, event: yaml.Event, what: str) -> None:
        line = event.start_mark.line + 1 if event.start_mark else "?"
        raise JobError(f'job file {self.origin!r}, line {line}: {what} (docs/job-spec.md, "Limits")')
