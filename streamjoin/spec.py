"""The job model: an immutable description of a join job, checked before any data moves.

A `JoinSpec` says which sources to join, in which order, under which conditions and time bounds,
and where the result goes. It holds no data and runs nothing: the runners (live and replay) take
it and decide which data and when. Build one in Python or load a YAML job file (docs/job-spec.md).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum

from streamjoin import family
from streamjoin.enums import SourceKind
from streamjoin.errors import JobError
from streamjoin.family import only as _only
from streamjoin.limits import check_nesting
from streamjoin.links import NAME, Link, build_link
from streamjoin.timeutil import format_duration, parse_duration, parse_instant

COMMIT_TIME = "commit"  # `time: commit`: a source's event time is its commit timestamp (docs/semantics.md)
DEFAULT_CLOCK_SKEW = timedelta(seconds=2)  # how late a table commit may become visible (docs/semantics.md)
# How far an event time may lead its commit time before the row is rejected (docs/semantics.md)
DEFAULT_MAX_FUTURE = timedelta(days=1)

# Which join types each pair of source kinds supports (ksqlDB's and Lenses' compatibility tables),
# and why the others are refused.
SUPPORTED_TYPES: dict[tuple[str, str], tuple[str, ...]] = {
    ("stream", "stream"): ("inner", "left", "right", "full", "cross"),
    ("stream", "table"): ("inner", "left"),
    ("table", "table"): ("inner", "left", "full"),
    ("table", "stream"): (),
}
_REFUSALS = {
    ("stream", "table", "full"): "a FULL OUTER stream-table join has no sound semantics: table updates "
    "never trigger output, so the table side's unmatched rows could never be emitted (ksqlDB, Lenses)",
    ("stream", "table", "right"): "only stream rows trigger a stream-table join, so the table cannot be "
    "the preserved side",
    ("table", "table", "right"): "RIGHT table-table joins are not supported (ksqlDB): swap the two "
    "tables and use LEFT",
    ("table", "stream"): "a table cannot drive a stream: put the stream first (stream JOIN table)",
    ("stream", "table", "cross"): "a CROSS join pairs rows of two streams within time bounds (SQLstream); "
    "a table's rows have no window to bound the pairs",
    ("table", "table", "cross"): "a CROSS join pairs rows of two streams within time bounds (SQLstream); "
    "the product of two tables has no key to update it by",
}


@dataclass(frozen=True)
class Source:
    """A Delta input: an append-only `stream` of events, or a keyed `table` that changes over time."""

    name: str
    kind: SourceKind
    path: str | None = None
    table: str | None = None
    time: str | None = None
    time_format: str | None = None
    key: tuple[str, ...] = ()
    changelog: bool = False
    deleted: str | None = None
    clock_skew: timedelta = DEFAULT_CLOCK_SKEW
    start_at: int | str | None = None  # the version (or the time) the job begins at (docs/semantics.md)
    max_future: timedelta | None = DEFAULT_MAX_FUTURE  # None: no bound

    def __post_init__(self) -> None:
        where = f"source {self.name!r}"
        _check_start_at(self.start_at, f"{where}: start_at")
        if not NAME.match(self.name or ""):
            raise JobError(
                f"{where}: a source name must be an identifier (letters, digits, _), e.g. 'orders'"
            )
        if self.kind not in list(SourceKind):
            raise JobError(f"{where}: kind is {self.kind!r}; write 'stream' (append-only events) or 'table'")
        object.__setattr__(self, "kind", SourceKind(self.kind))
        if bool(self.path) == bool(self.table):
            raise JobError(f"{where}: give exactly one of 'path' (a Delta folder) or 'table' (a table name)")
        if self.kind == "stream" and not self.time:
            raise JobError(
                f"{where}: a stream needs 'time', the name of its event-time column (or time: commit, "
                "its commit timestamp)"
            )
        if self.kind == "table" and self.time == COMMIT_TIME:  # what a table without `time` does already
            object.__setattr__(self, "time", None)
        if self.kind == "stream" and (self.changelog or self.deleted):
            raise JobError(
                f"{where}: 'changelog' and 'deleted' describe table sources; make it kind: table or remove them"
            )
        if self.deleted and not self.changelog:
            raise JobError(
                f"{where}: 'deleted' names the tombstone column of an append-only changelog; add changelog: true "
                "(a table updated in place records deletes in its change data feed)"
            )
        if self.clock_skew < timedelta(0):
            raise JobError(
                f"{where}: clock_skew {format_duration(self.clock_skew)} is negative; write 0s or more"
            )
        if self.max_future is not None and self.max_future < timedelta(0):
            raise JobError(
                f"{where}: max_future {format_duration(self.max_future)} is negative; write 0s or more, "
                "or none for no bound"
            )
        object.__setattr__(self, "key", tuple(self.key))

    @property
    def location(self) -> str:
        """The Delta path or table name, as given."""
        return self.path or self.table or ""


@dataclass(frozen=True)
class Output:
    """Where the result goes. Side tables sit beside it: <output>_late, _rejected, _metrics."""

    path: str | None = None
    table: str | None = None
    time: str = "event_time"
    partition_by: tuple[str, ...] = ()
    key: tuple[str, ...] = ()  # columns that identify an output row: never NULL, unique (validation)

    def __post_init__(self) -> None:
        if bool(self.path) == bool(self.table):
            raise JobError("output: give exactly one of 'path' (a Delta folder) or 'table' (a table name)")
        if not NAME.match(self.time or ""):
            raise JobError(f"output: time column name {self.time!r} must be an identifier, e.g. event_time")
        object.__setattr__(self, "partition_by", tuple(self.partition_by))
        object.__setattr__(self, "key", tuple(self.key))

    @property
    def location(self) -> str:
        return self.path or self.table or ""

    def side(self, suffix: str) -> str:
        """The location of a side table (`late`, `rejected`, `metrics`)."""
        return f"{self.location}_{suffix}"


@dataclass(frozen=True)
class Schedule:
    """When a job's slices are cut: every `every` (a duration, calendar days in `timezone`) from `start`."""

    every: str = "1d"
    timezone: str = "UTC"
    start: str | None = None  # ISO date or datetime: the first slice a scheduler runs (Airflow's start_date)
    live_every: str | None = None  # how often a scheduler runs the live runner (available-now), if at all
    verify: bool = False  # after each scheduled live run, compare the slices it wrote with the replay

    def __post_init__(self) -> None:
        parse_duration(self.every, "schedule: every")
        if self.live_every is not None:
            parse_duration(self.live_every, "schedule: live_every")
        if self.verify and self.live_every is None:
            raise JobError(
                "schedule: verify runs after each scheduled live run, but the job has no live_every; "
                "add e.g. live_every: 15m, or drop verify"
            )
        try:
            pendulum.timezone(self.timezone)
        except Exception:
            raise JobError(
                f"schedule: timezone {self.timezone!r} is unknown; write an IANA name such as UTC or Europe/Berlin"
            ) from None


@dataclass(frozen=True)
class Quality:
    """What every slice's output must satisfy (validated with Great Expectations, docs/validation.md)."""

    match_column: str | None = None  # an output column that is NULL exactly when a row is padded
    min_match_rate: float = 0.0  # share of output rows whose match_column is not NULL
    not_null: tuple[str, ...] = ()  # output columns padding never fills (the preserved side's)
    # Each link's match rate against the job's recent slices (docs/validation.md, "Links of a chain"):
    link_history: int = 7  # the last N valid slices whose median is the baseline; 0: no check
    link_min_history: int = 3  # the check applies once this many slices are known
    link_tolerance: float = 0.1  # how far below the baseline a slice's rate may fall
    link_min_rows: int = 20  # a link that reached fewer rows in a slice is not judged by it
    # A backfill run with --assume-earliest-known counts rows looked up in a table's earliest known
    # state as assumed (docs/backfills.md); a slice holding any is invalid unless this allows them.
    allow_assumed: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "not_null", tuple(self.not_null))
        if min(self.link_history, self.link_min_history, self.link_min_rows) < 0:
            raise JobError("quality: link_history, link_min_history and link_min_rows are counts: 0 or more")
        if not 0.0 <= float(self.link_tolerance) <= 1.0:
            raise JobError(
                f"quality: link_tolerance {self.link_tolerance!r} must lie between 0 and 1, e.g. 0.1"
            )
        if not 0.0 <= float(self.min_match_rate) <= 1.0:
            raise JobError(
                f"quality: min_match_rate {self.min_match_rate!r} must lie between 0 and 1, e.g. 0.95"
            )
        if self.min_match_rate and not self.match_column:
            raise JobError(
                "quality: min_match_rate needs match_column, the output column that is NULL when a row is unmatched"
            )


@dataclass(frozen=True)
class JobMeta:
    """What a job file says beside the rows it decides: a description, when its slices are cut
    (`schedule`) and what each slice's output must satisfy (`quality`). Changing it changes no
    row, so it is no part of the definition (`JoinSpec` equality, `definition_hash`)."""

    description: str = ""
    schedule: Schedule = Schedule()
    quality: Quality = Quality()


@dataclass(frozen=True)
class JoinSpec:
    """One join job's definition, what decides its rows: sources, the chain of joins in the order
    written, projection and output; `meta` carries the rest of its file (`JobMeta`)."""

    name: str
    sources: tuple[Source, ...]
    start: str
    joins: tuple[Link, ...]
    output: Output
    select: tuple[str, ...] = ()
    where: str | None = None
    # the time every source begins at, unless the source says otherwise; a version (an int, as YAML
    # reads `start_at: 12`) is accepted here only for __post_init__ to refuse it with the job's message
    start_at: int | str | None = None
    meta: JobMeta = field(default=JobMeta(), compare=False)

    def __post_init__(self) -> None:
        _check_start_at(self.start_at, f"job {self.name!r}: start_at", versions=False)
        object.__setattr__(self, "sources", tuple(self.sources))
        object.__setattr__(self, "joins", tuple(self.joins))
        object.__setattr__(self, "select", tuple(self.select))
        _validate(self)

    def source(self, name: str) -> Source:
        for source in self.sources:
            if source.name == name:
                return source
        raise JobError(f"job {self.name!r}: no source named {name!r}; sources are {', '.join(self.names)}")

    @property
    def names(self) -> tuple[str, ...]:
        """Names in the order they enter the join chain: sources, and the name of the rows a
        lateral join (UNNEST, a table function, a lookup) makes."""
        return (self.start,) + tuple(j.source for j in self.joins)

    def with_root(self, root: str | os.PathLike) -> JoinSpec:
        """The same job with relative Delta paths resolved against `root`: a local folder, or a
        URL (`s3a://bucket/prefix`), under which they are joined as URL paths."""

        def absolute(path: str | None) -> str | None:
            if path is None or "://" in path or os.path.isabs(path):
                return path
            return under_root(str(root), path)

        return replace(
            self,
            sources=tuple(replace(s, path=absolute(s.path)) for s in self.sources),
            output=replace(self.output, path=absolute(self.output.path)),
        )


def under_root(root: str, path: str) -> str:
    """`path` (relative) under `root`: a local folder's absolute path, or for a URL root the URL
    with `path` joined to its path (`..` and `.` resolved, never above the URL's own root)."""
    if "://" not in root:
        return str(Path(root, path).resolve())
    scheme, rest = root.split("://", 1)
    authority, _, prefix = rest.partition("/")
    joined = posixpath.normpath(posixpath.join("/", prefix, path))
    return f"{scheme}://{authority}{joined}"


def _max_future(body: dict, where: str) -> timedelta | None:
    """A source's `max_future`: a duration, or `none` for no bound; the default when absent."""
    if "max_future" not in body:
        return DEFAULT_MAX_FUTURE
    value = body["max_future"]
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    return parse_duration(value, f"{where}: max_future")


def _check_start_at(value: Any, where: str, versions: bool = True) -> None:
    """A start is a version (of one source) or an ISO time; checked before any table is read."""
    if value is None:
        return
    if isinstance(value, bool):
        raise JobError(
            f"{where}: {value!r} is neither a version nor a time; write e.g. 42 or 2024-05-01T00:00:00Z"
        )
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        if not versions:
            raise JobError(
                f"{where}: a job-wide start is a time (e.g. 2024-05-01T00:00:00Z); give versions per source"
            )
        if int(value) < 0:
            raise JobError(f"{where}: version {value} is negative")
        return
    parse_instant(str(value), where)


def _validate(spec: JoinSpec) -> None:
    """Structural checks that need no data and no schema."""
    where = f"job {spec.name!r}"
    if not NAME.match(spec.name or ""):
        raise JobError(f"job name {spec.name!r} must be an identifier (letters, digits, _)")
    for what, expression in _expressions(spec):
        check_nesting(str(expression), f"{where}, {what}")
    names = [s.name for s in spec.sources]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise JobError(f"{where}: source names must be unique; {', '.join(duplicates)} appear twice")
    if not spec.joins:
        raise JobError(f"{where}: 'joins' is empty; a join job needs at least one join")
    made = [j.source for j in spec.joins if j.makes_rows]
    for name in made:
        if name in names:
            raise JobError(
                f"{where}: {name!r} names both a source and the rows an UNNEST, table-function or lookup join makes; "
                "give the join another 'as'"
            )
    if made and len(spec.joins) > 1:
        raise JobError(
            f"{where}: an UNNEST, table-function or lookup join runs as the job's only join for now; split the job: "
            "write the expanded rows to a table in one job and join that table in a second"
        )
    joined = [n for n in spec.names if n not in made]
    for name in joined:
        if name not in names:
            raise JobError(
                f"{where}: the join chain names source {name!r}, which is not declared; sources are {', '.join(names)}"
            )
    if len(set(joined)) != len(joined):
        raise JobError(
            f"{where}: each source may appear once in the join chain; to self-join, declare the table twice under two names"
        )
    unused = [n for n in names if n not in joined]
    if unused:
        raise JobError(
            f"{where}: source(s) {', '.join(unused)} are declared but never joined; remove them or add a join"
        )
    _check_links(spec)


def _check_links(spec: JoinSpec) -> None:
    """Each link against the kinds it joins: its join type supported for that pair (ksqlDB's and
    Lenses' tables), its kind possible there (`Link.check_pair`), a table looked up by its key."""
    left_kind = spec.source(spec.start).kind
    for join in spec.joins:
        link = f"job {spec.name!r}, join with {join.source!r}"
        if join.makes_rows:
            if left_kind != SourceKind.STREAM:
                raise JobError(
                    f"{link}: UNNEST, table functions and lookups take the rows of a stream; {spec.start!r} is a table, "
                    "whose rows change. Declare it kind: stream if its rows are events"
                )
            continue
        right_kind = spec.source(join.source).kind
        pair = (left_kind, right_kind)
        if join.type not in SUPPORTED_TYPES[pair]:
            reason = _REFUSALS.get(pair + (join.type,)) or _REFUSALS.get(pair) or "unsupported"
            allowed = ", ".join(SUPPORTED_TYPES[pair]) or "none"
            article = "an" if join.type == "inner" else "a"
            raise JobError(
                f"{link}: {article} {join.type.upper()} join of a {left_kind} with a {right_kind} is refused: {reason}. Supported: {allowed}"
            )
        join.check_pair(left_kind, right_kind, link)
        join.check_job(spec, link)
        table = spec.source(join.source)
        if right_kind == SourceKind.TABLE and not table.key:
            raise JobError(
                f"{link}: {join.described} join against table {table.name!r} needs the table's primary key, which identifies "
                f"the versions of a row: add key: [<column>, ...] to source {table.name!r}"
            )
        # The result of joining a stream with anything is a stream; table-table stays a table.
        left_kind = SourceKind.STREAM if SourceKind.STREAM in pair else SourceKind.TABLE


def _expressions(spec: JoinSpec) -> list[tuple[str, Any]]:
    """Every SQL expression of the job, with where it stands: what a parser will read."""
    found: list[tuple[str, Any]] = []
    for join in spec.joins:
        found += [(f"join with {join.source!r}: {what}", text) for what, text in join.expressions()]
    found += [(f"select item {n + 1}", item) for n, item in enumerate(spec.select)]
    found.append(("where", spec.where))
    return [(what, expression) for what, expression in found if expression is not None]


# ---------------------------------------------------------------------------- job files


# The settings of a job file's sections, as YAML names them (SQL jobs name them alike: sql.py).
SOURCE_KEYS = (
    "path",
    "table",
    "kind",
    "time",
    "time_format",
    "key",
    "changelog",
    "deleted",
    "clock_skew",
    "start_at",
    "max_future",
)
OUTPUT_KEYS = ("path", "table", "time", "partition_by", "key")
SCHEDULE_KEYS = ("every", "timezone", "start", "live_every", "verify")
QUALITY_KEYS = (
    "match_column",
    "min_match_rate",
    "not_null",
    "link_history",
    "link_min_history",
    "link_tolerance",
    "link_min_rows",
    "allow_assumed",
)


def spec_from_dict(document: dict[str, Any], origin: str = "job") -> JoinSpec:
    """Build a JoinSpec from the job-file mapping (docs/job-spec.md)."""
    _only(
        document,
        {
            "name",
            "description",
            "sources",
            "from",
            "joins",
            "select",
            "where",
            "output",
            "schedule",
            "quality",
            "start_at",
        },
        origin,
    )
    for required in ("sources", "from", "joins", "output"):
        if required not in document:
            raise JobError(f"{origin}: missing '{required}'; see docs/job-spec.md")
    sources_doc = document["sources"]
    if not isinstance(sources_doc, dict) or not sources_doc:
        raise JobError(f"{origin}: 'sources' must map source names to their settings")
    sources = [_source_from_dict(str(name), body or {}, origin) for name, body in sources_doc.items()]
    joins_doc = document["joins"]
    if not isinstance(joins_doc, list):
        raise JobError(f"{origin}: 'joins' must be a list of joins, in the order they apply")
    joins, refusals = _joins_from_dict(
        joins_doc, str(document["from"]), {s.name: s.kind for s in sources}, origin
    )
    select = document.get("select") or ()
    if isinstance(select, str):
        select = [select]
    output = _output_from_dict(document["output"] or {}, origin)
    spec = JoinSpec(
        name=str(document.get("name")),
        sources=tuple(sources),
        start=str(document["from"]),
        joins=tuple(joins),
        select=tuple(str(s) for s in select),
        where=document.get("where"),
        output=output,
        meta=_meta_from_dict(document, origin),
        start_at=_start_value(document.get("start_at")),
    )
    if refusals:  # after the links were checked against the kinds they join
        raise JobError(refusals[0])
    return spec


def _source_from_dict(name: str, body: dict[str, Any], origin: str) -> Source:
    """One entry of `sources`."""
    where = f"{origin}: source {name!r}"
    _only(body, SOURCE_KEYS, where)
    skew = (
        parse_duration(body["clock_skew"], f"{where}: clock_skew")
        if "clock_skew" in body
        else DEFAULT_CLOCK_SKEW
    )
    return Source(
        name=name,
        kind=body.get("kind", "stream"),
        path=body.get("path"),
        table=body.get("table"),
        time=body.get("time"),
        time_format=body.get("time_format"),
        key=name_list(body.get("key")),
        changelog=bool(body.get("changelog", False)),
        deleted=body.get("deleted"),
        clock_skew=skew,
        start_at=_start_value(body.get("start_at")),
        max_future=_max_future(body, where),
    )


def _output_from_dict(output_doc: dict[str, Any], origin: str) -> Output:
    """The `output` section."""
    _only(output_doc, OUTPUT_KEYS, f"{origin}: output")
    return Output(
        path=output_doc.get("path"),
        table=output_doc.get("table"),
        time=output_doc.get("time", "event_time"),
        partition_by=name_list(output_doc.get("partition_by")),
        key=name_list(output_doc.get("key")),
    )


def _meta_from_dict(document: dict[str, Any], origin: str) -> JobMeta:
    """The job file's description, schedule and quality sections."""
    schedule_doc = document.get("schedule") or {}
    _only(schedule_doc, SCHEDULE_KEYS, f"{origin}: schedule")
    verify = schedule_doc.get("verify", False)
    if not isinstance(verify, bool):
        raise JobError(f"{origin}: schedule: verify must be true or false, not {verify!r}")
    schedule = Schedule(
        every=str(schedule_doc.get("every", "1d")),
        timezone=str(schedule_doc.get("timezone", "UTC")),
        start=None if schedule_doc.get("start") is None else str(schedule_doc["start"]),
        live_every=None if schedule_doc.get("live_every") is None else str(schedule_doc["live_every"]),
        verify=verify,
    )
    quality_doc = document.get("quality") or {}
    _only(quality_doc, QUALITY_KEYS, f"{origin}: quality")
    quality = Quality(
        match_column=quality_doc.get("match_column"),
        min_match_rate=float(quality_doc.get("min_match_rate", 0.0)),
        not_null=name_list(quality_doc.get("not_null")),
        link_history=int(quality_doc.get("link_history", Quality.link_history)),
        link_min_history=int(quality_doc.get("link_min_history", Quality.link_min_history)),
        link_tolerance=float(quality_doc.get("link_tolerance", Quality.link_tolerance)),
        link_min_rows=int(quality_doc.get("link_min_rows", Quality.link_min_rows)),
        allow_assumed=bool(quality_doc.get("allow_assumed", False)),
    )
    return JobMeta(str(document.get("description") or ""), schedule, quality)


def _joins_from_dict(
    items: list[Any], start: str, kinds: dict[str, SourceKind], origin: str
) -> tuple[list[Link], list[str]]:
    """The links in the order written, each knowing what is joined before it: a stream once any
    of it is one (ksqlDB), a table when all of it is, unknown when it names an undeclared source
    (which the job refuses); and why the links refuse settings they do not take."""
    links: list[Link] = []
    refusals: list[str] = []
    for item in items:
        before = [start, *(link.source for link in links)]
        known = [kinds.get(name) for name in before]
        left = (
            SourceKind.STREAM if SourceKind.STREAM in known else None if None in known else SourceKind.TABLE
        )
        link, refusal = _join_from_dict(item, origin, left, kinds)
        links.append(link)
        refusals += [refusal] if refusal else []
    return links, refusals


def _start_value(value: Any) -> int | str | None:
    """YAML reads `start_at: 2024-05-01` as a date and `start_at: 12` as a number: keep versions as
    ints and everything else as text."""
    if value is None or isinstance(value, (int, str)):
        return value
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def _join_from_dict(
    item: Any, origin: str, left: SourceKind | None, kinds: dict[str, SourceKind]
) -> tuple[Link, str | None]:
    """A link as a job file writes it; its kind follows from its settings and the kinds of what
    it joins (`links.link_class`): `left`, what is joined so far, and its source's in `kinds`.
    With it, why it refuses a setting it does not take (`links.build_link`)."""
    if isinstance(item, dict) and True in item:
        item = {("on" if k is True else k): v for k, v in item.items()}  # YAML 1.1 reads `on:` as true
    if isinstance(item, dict) and "join" not in item and any(key in item for key, _ in family.made_by()):
        return _made_from_dict(item, origin), None
    if not isinstance(item, dict) or "join" not in item:
        raise JobError(
            f"{origin}: each entry of 'joins' needs 'join: <source name>' (or 'unnest: <array column>' or "
            "'function: module:udtf' with 'as: <name>')"
        )
    where = f"{origin}: join with {item['join']!r}"
    _only(item, (*_JOIN_KEYS, *family.join_keys()), where)
    given: dict[str, Any] = {key: item[key] for key in ("type", "on") if item.get(key) is not None}
    if "using" in item:
        given["using"] = name_list(item["using"])
    given |= {"natural": True} if item.get("natural") else {}
    given |= family.settings(item, where)  # e.g. bounds, windows, ROWS windows, as_of
    if "grace" in item:
        given["grace"] = parse_duration(item["grace"], f"{where}: grace")
    source = str(item["join"])
    return build_link(source, given, left, kinds.get(source))


_JOIN_KEYS = (
    "join",
    "type",
    "on",
    "using",
    "natural",
    "grace",
)  # and the keys of the families that are plug-ins (streamjoin/family.py)


def _made_from_dict(item: dict, origin: str) -> Link:
    """A join item that makes rows for each row (`unnest: orders.tags`, `function: pkg.mod:udtf`,
    `lookup: {url, table}`: `family.Family.made_by`), named by `as`; its family builds the link."""
    makers = family.made_by()
    kind = next(k for k, _ in makers if k in item)
    where = f"{origin}: join {kind} {item[kind]!r}"
    _only(item, {*(k for k, _ in makers), *family.made_keys(), "as", "type", "on"}, where)
    alias = item.get("as")
    if not isinstance(alias, str) or not NAME.match(alias):
        raise JobError(
            f"{where}: give the rows it makes a name with 'as' (an identifier), e.g. as: t; select them as t.<column>"
        )
    link = f"join with {alias!r}"
    if sum(k in item for k, _ in makers) > 1:
        named = [words for _, words in makers]
        raise JobError(f"{link}: give one of {', '.join(named[:-1])} or {named[-1]}")
    if not isinstance(item.get("args", []), list):
        raise JobError(f"{where}: 'args' is a list of expressions, e.g. args: [orders.comment]")
    plugin = family.maker(item)
    assert plugin is not None and plugin.made is not None  # the family whose key the item gives
    return plugin.made(item, where)


def name_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)
