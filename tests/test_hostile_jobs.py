"""Hostile job files: nesting that would exhaust the parsers' stack, YAML aliases that expand
without bound, keys given twice. Each is refused in one line naming the limit or the key, and
nothing here needs Spark (docs/job-spec.md, "Limits")."""

from __future__ import annotations

import time

import pytest

from streamjoin.errors import JobError
from streamjoin.jobfile import load_job
from streamjoin.limits import MAX_NESTING
from streamjoin.plan import split_conjuncts
from streamjoin.spec import spec_from_dict
from streamjoin.sql import spec_from_sql

JOB = """\
name: j
sources:
  a: {path: a, kind: stream, time: ts}
  b: {path: b, kind: stream, time: ts}
from: a
joins:
  - join: b
    on: a.id = b.id
    within: 1h
output: {path: out}
"""


def document(**changes) -> dict:
    """The job of JOB as a mapping, its join's settings and top-level settings changed."""
    join = {"join": "b", "on": "a.id = b.id", "within": "1h"}
    join.update({k.removeprefix("join_"): v for k, v in changes.items() if k.startswith("join_")})
    top = {k: v for k, v in changes.items() if not k.startswith("join_")}
    return {
        "name": "j",
        "sources": {
            "a": {"path": "a", "kind": "stream", "time": "ts"},
            "b": {"path": "b", "kind": "stream", "time": "ts"},
        },
        "from": "a",
        "joins": [join],
        "output": {"path": "out"},
        **top,
    }


def nested(depth: int, opening: str, inner: str, closing: str) -> str:
    return opening * depth + inner + closing * depth


@pytest.mark.parametrize(
    "changes, where",
    [
        ({"join_on": nested(49, "(", "a.id = b.id", ")")}, "join with 'b': on nests 49 levels deep"),
        ({"join_on": "a.id = b.id AND " + nested(60, "abs(", "a.x", ")") + " > 0"}, "on nests 60 levels"),
        ({"select": ["a.id", nested(30, "CASE WHEN a.x > 0 THEN ", "1", " END")]}, "select item 2 nests 30"),
        ({"where": "NOT " * 300 + "a.flag"}, "where nests 300 levels deep"),
        ({"select": [nested(25, "array(", "a.x", ")") + "[0]" * 25]}, "select item 1 nests 25 levels"),
        ({"select": [nested(30, "CASE WHEN a.end > 0 THEN ", "1", " END")]}, "select item 1 nests 30"),
    ],
)
def test_an_expression_nested_past_the_limit_is_refused_naming_it(changes, where):
    """49 parentheses in an ON clause crashed the parser (a RecursionError and 3,001 lines)."""
    with pytest.raises(JobError) as error:
        spec_from_dict(document(**changes))
    message = str(error.value)
    assert message.startswith("job 'j', ") and where in message
    assert f"the limit is {MAX_NESTING}" in message and "\n" not in message


def test_an_expression_at_the_limit_is_taken_and_strings_do_not_count():
    spec = spec_from_dict(
        document(
            join_on=nested(MAX_NESTING, "(", "a.id = b.id", ")"),
            select=[nested(MAX_NESTING, "abs(", "a.x", ")"), "'" + "(" * 100 + "' AS text"],
        )
    )
    assert spec.joins[0].on.startswith("(" * MAX_NESTING)


def test_a_sql_job_nested_past_the_limit_is_refused():
    declarations = (
        "CREATE STREAM a WITH (path='a', time='ts');\nCREATE STREAM b WITH (path='b', time='ts');\n"
    )
    query = "CREATE STREAM o WITH (path='o') AS SELECT a.id FROM a JOIN b WITHIN 1 HOUR ON {};"
    with pytest.raises(JobError) as error:
        spec_from_sql(declarations + query.format(nested(49, "(", "a.id = b.id", ")")), "deep.sql")
    assert str(error.value).startswith("deep.sql: the job's SQL nests 49 levels deep")
    at_limit = spec_from_sql(declarations + query.format(nested(MAX_NESTING, "(", "a.id = b.id", ")")))
    assert at_limit.joins[0].source == "b"


def test_a_condition_of_thousands_of_terms_splits():
    """A chain of ANDs nests as deep as it is long: the split walks it without recursion."""
    terms = [f"a.x{n} = b.y{n}" for n in range(1100)]
    assert split_conjuncts(" AND ".join(terms)) == terms


@pytest.mark.parametrize(
    "nesting, line",
    [
        ("description: " + nested(3000, "[", "", "]"), 11),  # failed after "structure ok"
        ("description:\n" + "".join("  " * level + "-\n" for level in range(1, 40)), 31),
    ],
)
def test_a_yaml_job_nested_past_the_limit_is_refused_with_its_line(tmp_path, nesting, line):
    file = tmp_path / "deep.yaml"
    file.write_text(JOB + nesting + "\n")
    with pytest.raises(JobError) as error:
        load_job(file)
    assert str(error.value) == (
        f"job file {str(file)!r}, line {line}: mappings and lists nest deeper than 20 levels "
        '(docs/job-spec.md, "Limits")'
    )


def test_nested_aliases_are_refused_fast_before_they_expand(tmp_path):
    """Seven anchors nine times each, 2 KB of YAML: it built a string of 64 MB (eight: 580 MB,
    24 s), and validate-job said ok."""
    anchors = ['  a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    anchors += [f"  a{n}: &a{n} [{','.join([f'*a{n - 1}'] * 9)}]" for n in range(1, 7)]
    file = tmp_path / "bomb.yaml"
    file.write_text(JOB + "description:\n" + "\n".join(anchors) + "\n")
    started = time.perf_counter()
    with pytest.raises(JobError) as error:
        load_job(file)
    assert time.perf_counter() - started < 1.0
    assert str(error.value).startswith(
        f"job file {str(file)!r}, line 16: alias *a3 takes what the aliases repeat past 10,000 values"
    )


def test_an_alias_inside_its_own_anchor_or_nesting_deep_through_aliases_is_refused(tmp_path):
    file = tmp_path / "cycle.yaml"
    file.write_text(JOB + "description: &c [1, *c]\n")
    with pytest.raises(JobError, match=r"line 11: alias \*c sits inside the value &c names, a cycle"):
        load_job(file)
    chain = ["  d0: &d0 [x]"] + [f"  d{n}: &d{n} [*d{n - 1}]" for n in range(1, 25)]
    file.write_text(JOB + "description:\n" + "\n".join(chain) + "\n")
    with pytest.raises(JobError, match=r"makes mappings and lists nest deeper than 20 levels"):
        load_job(file)


def test_shared_settings_through_anchors_and_merge_keys_still_load(tmp_path):
    """Aliases a job needs (one source's settings merged into another, overriding some) load."""
    file = tmp_path / "shared.yaml"
    file.write_text(
        JOB.replace("a: {path: a, kind: stream, time: ts}", "a: &stream {path: a, kind: stream, time: ts}")
        .replace("b: {path: b, kind: stream, time: ts}", "b: {<<: *stream, path: b}")
        .replace("within: 1h", "within: &width 1h\n    grace: *width")
    )
    spec = load_job(file, root=tmp_path)
    assert spec.source("b").path == str(tmp_path / "b") and spec.source("b").time == "ts"
    assert spec.joins[0].grace == spec.joins[0].bounds.upper


@pytest.mark.parametrize(
    "changed, key, lines",
    [
        (JOB + "name: other\n", "name", "line 1 and line 11"),
        (JOB.replace("time: ts}\nfrom", "time: ts, time: t2}\nfrom"), "time", "line 4 and line 4"),
        (JOB.replace("    within: 1h\n", "    within: 1h\n    on: a.x = b.x\n"), "on", "line 8 and line 10"),
    ],
)
def test_a_key_given_twice_is_refused_naming_it_and_both_lines(tmp_path, changed, key, lines):
    """YAML keeps the last of two equal keys silently: a job would run another condition."""
    file = tmp_path / "twice.yaml"
    file.write_text(changed)
    with pytest.raises(JobError) as error:
        load_job(file)
    assert str(error.value) == (
        f"job file {str(file)!r}: key {key!r} is given twice in one mapping, on {lines}; keep one "
        "(YAML would keep the last silently)"
    )
