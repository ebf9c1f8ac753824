"""The code's shape, checked by `make check` (docs/architecture.md, "Shape rules").

- no function in streamjoin/ longer than 60 lines (the CLI's argument table aside) or taking more
  than 7 parameters (`self` and `cls` not counted);
- no import cycle between streamjoin's modules, counting imports inside functions (not those
  under `if TYPE_CHECKING:`, which never run);
- the generic layers (runners, backfill, kernel, metrics, accounting, spec, sql, plan, links) name
  no join family: a family's link, syntax, binding, explain text and step live in its module.

What the code broke before these rules is listed in infra/shape-baseline.txt. A finding not in
that list fails the check, and so does a listed one that no longer occurs (remove its line): the
list only shrinks.

    .venv/bin/python infra/shape.py            # check
    .venv/bin/python infra/shape.py --findings # print every finding, one per line
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "streamjoin"
BASELINE = ROOT / "infra" / "shape-baseline.txt"
MAX_LINES, MAX_PARAMETERS = 60, 7
EXEMPT = {"streamjoin/cli.py:build_parser"}  # the CLI's argument table
# The generic layers: a family's syntax, binding, explain text and kernel step live in its own module
# (streamjoin/joins/), and these name none of them.
FAMILY_BLIND = [
    "streamjoin/runners",
    "streamjoin/backfill.py",
    "streamjoin/kernel.py",
    "streamjoin/metrics.py",
    "streamjoin/accounting.py",
    "streamjoin/spec.py",
    "streamjoin/sql.py",
    "streamjoin/plan.py",
    "streamjoin/links.py",
]
FAMILY_NAME = re.compile(
    r"lookup|lateral|unnest|table_?table|temporal|as_?of|enrich|chain|tvf|table_function"
    r"|IntervalJoin|WindowJoin|RowsJoin|LookupJoin|LateralJoin|TableTableJoin|Enrichment|Chain"
    r"|IntervalLink|WindowLink|RowsLink|StreamTableLink|TimeBounds|Windows\b",
    re.IGNORECASE,
)


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _where(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _functions(modules: dict[str, Path]) -> Iterator[str]:
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            name = f"{_where(path)}:{node.name}"
            if name in EXEMPT:
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_LINES:
                yield f"long {name}"
            args = node.args
            named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
            count = len(named) + (args.vararg is not None) + (args.kwarg is not None)
            if named and named[0].arg in ("self", "cls"):
                count -= 1
            if count > MAX_PARAMETERS:
                yield f"parameters {name}"


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    typing_only = {  # `if TYPE_CHECKING:` imports never run
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for statement in node.body
        for inner in ast.walk(statement)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            submodules = [f"{module}.{alias.name}" for alias in node.names]
            # `from package import module` imports the module; the package only for other names
            named_other = any(target not in modules for target in submodules)
            targets = [*([module] if named_other else []), *submodules]
        else:
            continue
        found |= {target for target in targets if target in modules and target != name}
    return found


def _cycles(modules: dict[str, Path]) -> Iterator[str]:
    """Each strongly connected group of more than one module (Tarjan's algorithm, iteratively)."""
    graph = {name: sorted(_imports(name, path, modules)) for name, path in modules.items()}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    for root in graph:
        if root in order:
            continue
        work = [(root, 0)]
        while work:
            node, edge = work.pop()
            if edge == 0:
                order[node] = low[node] = len(order)
                stack.append(node)
            if edge < len(graph[node]):
                work.append((node, edge + 1))
                nxt = graph[node][edge]
                if nxt not in order:
                    work.append((nxt, 0))
                elif nxt in stack:
                    low[node] = min(low[node], order[nxt])
                continue
            if low[node] == order[node]:
                group = stack[stack.index(node) :]
                del stack[stack.index(node) :]
                if len(group) > 1:
                    yield "cycle " + " ".join(sorted(group))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])


# Methods of other libraries whose names match a family's by accident: sqlglot's Expression.unnest()
# strips a node's parentheses.
FOREIGN_METHODS = {"unnest"}


def _family_names() -> Iterator[str]:
    paths = [p for entry in FAMILY_BLIND for p in sorted((ROOT / entry).glob("**/*.py")) or [ROOT / entry]]
    for path in paths:
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            attribute = getattr(node, "attr", None)
            if attribute in FOREIGN_METHODS:
                attribute = None
            for name in (getattr(node, "id", None), attribute, getattr(node, "arg", None)):
                if isinstance(name, str) and FAMILY_NAME.search(name):
                    names.add(name)
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and FAMILY_NAME.search(node.name):
                names.add(node.name)
        yield from (f"family {_where(path)} {name}" for name in sorted(names))


def findings() -> list[str]:
    modules = _modules()
    return sorted({*_functions(modules), *_cycles(modules), *_family_names()})


def main(argv: list[str]) -> int:
    found = findings()
    if "--findings" in argv:
        print("\n".join(found))
        return 0
    known = {
        line.strip()
        for line in BASELINE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    new, gone = sorted(set(found) - known), sorted(known - set(found))
    for line in new:
        print(f"shape: {line} (rules: infra/shape.py; split it, or pass an options object)")
    for line in gone:
        print(f"shape: '{line}' no longer occurs: remove its line from infra/shape-baseline.txt")
    if not new and not gone:
        print(f"shape: ok ({len(known)} known exceptions left in infra/shape-baseline.txt)")
    return 1 if new or gone else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
