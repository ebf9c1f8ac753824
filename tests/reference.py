"""A plain-Python reference of the interval join's semantics, for property tests to compare against.

Deliberately naive (nested loops over every row) so that it is obviously the spec:

- A row's arrival position is (commit timestamp, source index, commit version); side 0 is the
  `from` source, side 1 the joined one.
- Rows with a NULL key or NULL time are rejected. The frontier is the smallest, over the two
  sources, of each source's newest position with rows (any rows, rejected ones included); rows
  after it (or all rows, while a source has none) are unsettled.
- Watermark at position p: the largest event time of accepted settled rows at positions strictly
  before p, minus grace. A settled row is late iff its time is below it (never, in `complete`).
- On-time rows l (side 0) and r (side 1) join iff keys are equal, the residual holds and
  lo <= r.t - l.t <= hi; the output time is max(l.t, r.t).
- An on-time row with no partner is closed iff M_end - grace > l.t + hi (side 0) or
  M_end - grace > r.t - lo (side 1), M_end being the largest time of all accepted settled rows.
  Closed rows of a preserved side come out padded (unmatched_emitted), of the other side are
  dropped (unmatched_dropped); rows not closed stay open.
- Eager emission (`emit="eager"`) pads instead a preserved on-time row e with no partner o such
  that o.pos < e.pos or C(o.pos) <= due(e), once M_end > due(e) (or the input is closed): C(p) is
  the largest time of accepted settled rows at positions <= p (the streams' clock after p), and
  due(e) = min(e.t, edge + grace), edge as below. The bucket counts do not change.
- A closed input (`closed`: it has ended) settles every row and closes every window.
- A CROSS join has no keys (a NULL key is not rejected) and pairs every two on-time rows in the
  bounds; like INNER it pads nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

BUCKETS = (
    "rows_in",
    "rejected",
    "late",
    "joined",
    "unmatched_emitted",
    "unmatched_dropped",
    "open",
    "unsettled",
)
PRESERVED = {"inner": (), "left": (0,), "right": (1,), "full": (0, 1), "cross": ()}


@dataclass(frozen=True)
class Event:
    side: int  # 0: the `from` source, 1: the joined source
    id: str
    key: str | None
    t: int | None  # event time in any integer unit (the tests use seconds)
    pos: tuple[int, int, int]  # (commit timestamp, side, commit version)
    v: int = 0  # a payload for residual predicates


def reference(
    events: list[Event],
    lo: int,
    hi: int,
    grace: int,
    how: str,
    mode: str = "exact",
    residual: Callable[[Event, Event], bool] = lambda l, r: True,
    closed: bool = False,
    emit: str = "final",
) -> tuple[Counter, dict[int, dict[str, int]]]:
    """(output multiset of (left id | None, right id | None, output time), bucket counts per side)."""
    emitted, counts = emissions(events, lo, hi, grace, how, mode, residual, closed, emit)
    return Counter(row for row, _ in emitted), counts


def emissions(
    events: list[Event],
    lo: int,
    hi: int,
    grace: int,
    how: str,
    mode: str = "exact",
    residual: Callable[[Event, Event], bool] = lambda l, r: True,
    closed: bool = False,
    emit: str = "final",
    world: list[Event] | None = None,
    sources: int = 2,
    derived: bool = False,
    waiting: tuple[int, ...] = (),
) -> tuple[list[tuple[tuple, tuple[int, int, int]]], dict[int, dict[str, int]]]:
    """`reference`'s output rows, each with the position at which it became known (what a chain's
    next link sees): a pair at the later of its rows' positions; a padded row at the first settled
    position, at or after its own, whose clock C(p) passes its due time (final: edge + grace;
    eager: due(e)); a row only a closed input decides, at the last position of the input.

    In a chain, `world` holds every stream row of the job (`sources` streams): the frontier, the
    clock and the watermarks are the whole job's, not the two inputs'. `derived`: side 0 holds the
    rows an earlier link emitted (settled already; a NULL key, a padded side's, only never matches).
    `waiting`: times of side-0 rows an earlier link still holds back; a side-1 row within the bounds
    of one of them stays open."""
    assert mode in ("exact", "complete") and how in PRESERVED and emit in ("final", "eager")
    world = events if world is None else world
    counts = {side: dict.fromkeys(BUCKETS, 0) for side in (0, 1)}
    newest = {}
    for e in world:
        newest[e.side] = max(newest.get(e.side, e.pos), e.pos)
    frontier = min(newest.values()) if len(newest) == sources else None

    def rejected(e: Event) -> bool:
        return (e.key is None and how != "cross") or e.t is None

    def is_settled(e: Event) -> bool:
        return closed or (frontier is not None and e.pos <= frontier)

    accepted = [e for e in world if not rejected(e) and is_settled(e)]  # the clock's rows
    settled = []
    for e in events:
        counts[e.side]["rows_in"] += 1
        if derived and e.side == 0:
            settled.append(e)
        elif rejected(e):
            counts[e.side]["rejected"] += 1
        elif not is_settled(e):
            counts[e.side]["unsettled"] += 1
        else:
            settled.append(e)

    on_time = {0: [], 1: []}
    for e in settled:
        before = [o.t for o in accepted if o.pos < e.pos]
        if mode == "exact" and before and e.t < max(before) - grace:
            counts[e.side]["late"] += 1
        else:
            on_time[e.side].append(e)

    def match(l: Event, r: Event) -> bool:
        keyed = how == "cross" or (l.key is not None and l.key == r.key)
        return keyed and lo <= r.t - l.t <= hi and residual(l, r)

    out = []
    for l in on_time[0]:
        for r in on_time[1]:
            if match(l, r):
                out.append(((l.id, r.id, max(l.t, r.t)), max(l.pos, r.pos)))

    m_end = max((e.t for e in accepted), default=None)
    positions = sorted({o.pos for o in accepted})
    last = max(e.pos for e in world) if world else None

    def padded(e: Event, due: int) -> tuple[tuple, tuple[int, int, int]]:
        at = next((p for p in positions if p >= e.pos and clock(p) > due), last)
        return ((e.id, None, e.t) if e.side == 0 else (None, e.id, e.t)), at

    def clock(p: tuple[int, int, int]) -> int:
        return max(o.t for o in accepted if o.pos <= p)

    for side in PRESERVED[how] if emit == "eager" else ():
        for e in on_time[side]:
            due = min(e.t, (e.t + hi if side == 0 else e.t - lo) + grace)
            if not (closed or m_end > due):
                continue
            partners = [o for o in on_time[1 - side] if (match(e, o) if side == 0 else match(o, e))]
            if not any(o.pos <= e.pos or clock(o.pos) <= due for o in partners):
                out.append(padded(e, due))

    for side in (0, 1):
        for e in on_time[side]:
            if any(match(e, o) if side == 0 else match(o, e) for o in on_time[1 - side]):
                counts[side]["joined"] += 1
                continue
            edge = e.t + hi if side == 0 else e.t - lo
            awaited = side == 1 and any(lo <= e.t - w <= hi for w in waiting)
            if closed or (m_end - grace > edge and not awaited):
                if side in PRESERVED[how]:
                    counts[side]["unmatched_emitted"] += 1
                    if emit == "final":
                        out.append(padded(e, edge + grace))
                else:
                    counts[side]["unmatched_dropped"] += 1
            else:
                counts[side]["open"] += 1
    return out, counts


def _on_time(
    events: list[Event], closed: bool, grace: int | None
) -> tuple[dict[int, dict[str, int]], dict[int, list[Event]], list[Event]]:
    """Two streams' rows as `emissions` settles them: rows_in, rejected (NULL key or time),
    unsettled (after the frontier, unless `closed`) and late (below the watermark at its position;
    `grace` None: nothing is late) counted per side; the on-time rows per side; and every
    accepted settled row (the clock's)."""
    counts = {side: dict.fromkeys(BUCKETS, 0) for side in (0, 1)}
    newest = {}
    for e in events:
        newest[e.side] = max(newest.get(e.side, e.pos), e.pos)
    frontier = min(newest.values()) if len(newest) == 2 else None

    def is_settled(e: Event) -> bool:
        return closed or (frontier is not None and e.pos <= frontier)

    accepted = [e for e in events if e.key is not None and e.t is not None and is_settled(e)]
    on_time: dict[int, list[Event]] = {0: [], 1: []}
    for e in events:
        counts[e.side]["rows_in"] += 1
        if e.key is None or e.t is None:
            counts[e.side]["rejected"] += 1
        elif not is_settled(e):
            counts[e.side]["unsettled"] += 1
        else:
            before = [o.t for o in accepted if o.pos < e.pos]
            if grace is not None and before and e.t < max(before) - grace:
                counts[e.side]["late"] += 1
            else:
                on_time[e.side].append(e)
    return counts, on_time, accepted


def window_reference(
    events: list[Event],
    hop: int,
    size: int,
    grace: int,
    how: str,
    mode: str = "exact",
    residual: Callable[[Event, Event], bool] = lambda l, r: True,
    closed: bool = False,
    end: int | None = None,
) -> tuple[Counter, dict[int, dict[str, int]]]:
    """A window join (TUMBLE: hop = size; HOP) as docs/design-window-joins.md states it: rows are
    rejected, unsettled and late as in `emissions`; row e lies in the windows [s, s + size) with s
    a multiple of `hop` and s <= e.t < s + size. On-time rows l and r with equal keys (and the
    residual) write one row per window they share, at max(l.t, r.t). Window s is closed iff the
    input is closed or M_end - grace > s + size - 1 (`end` overrides M_end, the largest accepted
    settled time); a preserved row writes one padded row per closed window of its own without a
    partner there. A row is `joined` if it pairs in any window, else decided (unmatched) once its
    last window is closed, else `open`."""
    counts, on_time, accepted = _on_time(events, closed, grace if mode == "exact" else None)

    def windows(t: int) -> list[int]:
        last = t - t % hop
        return [last - i * hop for i in range(size // hop)]

    m_end = end if end is not None else max((e.t for e in accepted), default=None)

    def is_closed(start: int) -> bool:
        return closed or (m_end is not None and m_end - grace > start + size - 1)

    out: Counter = Counter()
    partners: dict[tuple[int, str], set[int]] = {}  # (side, id) -> windows where it paired
    for l in on_time[0]:
        for r in on_time[1]:
            if l.key != r.key or not residual(l, r):
                continue
            for w in set(windows(l.t)) & set(windows(r.t)):
                out[(l.id, r.id, max(l.t, r.t))] += 1
                partners.setdefault((0, l.id), set()).add(w)
                partners.setdefault((1, r.id), set()).add(w)
    for side in (0, 1):
        for e in on_time[side]:
            paired = partners.get((side, e.id), set())
            if side in PRESERVED[how]:
                for w in windows(e.t):
                    if w not in paired and is_closed(w):
                        out[(e.id, None, e.t) if side == 0 else (None, e.id, e.t)] += 1
            if paired:
                counts[side]["joined"] += 1
            elif is_closed(max(windows(e.t))):
                counts[side]["unmatched_emitted" if side in PRESERVED[how] else "unmatched_dropped"] += 1
            else:
                counts[side]["open"] += 1
    return out, counts


def rows_reference(
    events: list[Event],
    widths: dict[int, int],
    how: str,
    residual: Callable[[Event, Event], bool] = lambda l, r: True,
    closed: bool = False,
) -> tuple[Counter, dict[int, dict[str, int]]]:
    """A ROWS-window join as docs/design-window-joins.md (section 2) states it: rows rejected and
    unsettled as in `emissions`, none late. Settled rows in arrival order (position, then event
    time, then id, as the content orders rows of one commit); a row z pairs with each of the
    `widths[other side]` latest rows of the other side with its key that came before it (none
    when that side has no width). A row of a side without a width is decided as it arrives; one
    of a side with width w once w later rows of its side and key have come (or the input is
    closed): joined if it ever paired, else padded (preserved side) or dropped; open meanwhile."""
    counts, on_time, _ = _on_time(events, closed, None)
    order = sorted(on_time[0] + on_time[1], key=lambda e: (e.pos, e.t, e.id))
    history: dict[tuple[int, str | None], list[Event]] = {}
    out: Counter = Counter()
    paired: set[tuple[int, str]] = set()
    for z in order:
        width = widths.get(1 - z.side, 0)
        for y in history.get((1 - z.side, z.key), [])[-width:] if width else []:
            l, r = (z, y) if z.side == 0 else (y, z)
            if residual(l, r):
                out[(l.id, r.id, max(l.t, r.t))] += 1
                paired |= {(0, l.id), (1, r.id)}
        history.setdefault((z.side, z.key), []).append(z)
    for z in order:
        width = widths.get(z.side, 0)
        mine = history[(z.side, z.key)]
        decided = not width or closed or len(mine) - 1 - mine.index(z) >= width
        if (z.side, z.id) in paired:
            counts[z.side]["joined"] += 1
        elif decided:
            preserved = z.side in PRESERVED[how]
            counts[z.side]["unmatched_emitted" if preserved else "unmatched_dropped"] += 1
            if preserved:
                out[(z.id, None, z.t) if z.side == 0 else (None, z.id, z.t)] += 1
        else:
            counts[z.side]["open"] += 1
    return out, counts


# ---------------------------------------------------------------------------- enrichment joins

TABLE_BUCKETS = ("rows_in", "rejected", "late", "applied")
LINK_BUCKETS = ("reached", "matched", "padded", "dropped")
STREAM_BUCKETS = ("rows_in", "rejected", "joined", "unmatched_emitted", "unmatched_dropped", "open")


@dataclass(frozen=True)
class Change:
    """One change of a table source: a new value of its key, or a tombstone (`deleted`)."""

    id: str | None
    key: tuple
    t: int | None  # version time (event-time temporal) or any ordered value (ASOF)
    pos: tuple[int, int, int]  # (commit timestamp, side, commit version)
    deleted: bool = False


Lookup = Callable[[Event, str | None], tuple[bool, Change | None]]  # row, lookup key -> (decided, match)


def timed_versions(
    table: list[Change], grace: int, mode: str = "exact", in_place: bool = False
) -> tuple[dict[str, int], list[Change], int | None]:
    """A table whose version times are `t`: (counts, applied changes, watermark).

    - `in_place`: the table is updated in place, and a delete's `t` is the deleted row's time. Its
      version time is the largest `t` of the accepted non-delete changes at earlier positions (or
      its own, if larger or without any).
    - Table changes with a NULL key or time are rejected. A change is late (exact mode) iff its
      time is below the table's watermark at its position: the largest time of accepted changes
      at earlier positions minus grace. Other accepted changes are applied.
    - The watermark at the end: the largest accepted change time minus grace.
    """
    counts = dict.fromkeys(TABLE_BUCKETS, 0)
    accepted = []
    for c in table:
        counts["rows_in"] += 1
        if c.key[0] is None or c.t is None:
            counts["rejected"] += 1
        else:
            accepted.append(c)
    if in_place:
        accepted = [
            replace(c, t=max([c.t] + [o.t for o in accepted if o.pos < c.pos and not o.deleted]))
            if c.deleted
            else c
            for c in accepted
        ]
    applied = []
    for c in accepted:
        before = [o.t for o in accepted if o.pos < c.pos]
        if mode == "exact" and before and c.t < max(before) - grace:
            counts["late"] += 1
        else:
            counts["applied"] += 1
            applied.append(c)
    largest = max((c.t for c in accepted), default=None)
    return counts, applied, None if largest is None else largest - grace


def temporal_table(
    table: list[Change], grace: int, mode: str = "exact", in_place: bool = False
) -> tuple[dict[str, int], Lookup]:
    """A changelog keyed by key[0] whose version times are `t` (`timed_versions`), looked up FOR
    SYSTEM_TIME AS OF the row's time: (table counts, lookup). A stream row is decided iff its time
    is below the table's watermark; then it joins the version of its key valid at its time: the
    applied change with the largest (t, position) among those with t <= l.t, unless that is a
    tombstone."""
    counts, applied, watermark = timed_versions(table, grace, mode, in_place)

    def lookup(e: Event, key: str | None) -> tuple[bool, Change | None]:
        decided = watermark is not None and e.t < watermark
        valid = [c for c in applied if c.key[0] == key and c.t <= e.t]
        version = max(valid, key=lambda c: (c.t, c.pos), default=None)
        return decided, version if version is not None and not version.deleted else None

    return counts, lookup


def history_asof_table(
    table: list[Change], grace: int, following: bool, mode: str = "exact", in_place: bool = False
) -> tuple[dict[str, int], Lookup]:
    """ASOF over a table's whole history (RisingWave's result): ON l.k = r.k AND r.t <= l.t
    (nearest preceding) or r.t >= l.t (`following`). Every applied version that is not a tombstone
    is a row at its version time (`timed_versions`), whenever it arrived; the nearest is the
    largest t (preceding) or the smallest (following), of equal t the latest arrival. Decided:
    preceding iff l.t is below the watermark; following iff the nearest row's t is."""
    counts, applied, watermark = timed_versions(table, grace, mode, in_place)

    def lookup(e: Event, key: str | None) -> tuple[bool, Change | None]:
        rows = [c for c in applied if not c.deleted and c.key[0] == key]
        if following:
            nearest = min(
                (c for c in rows if c.t >= e.t), key=lambda c: (c.t, tuple(-p for p in c.pos)), default=None
            )
            return watermark is not None and nearest is not None and nearest.t < watermark, nearest
        nearest = max((c for c in rows if c.t <= e.t), key=lambda c: (c.t, c.pos), default=None)
        return watermark is not None and e.t < watermark, nearest

    return counts, lookup


def arrival_table(table: list[Change], stream: list[Event], skew: int = 0, asof: bool = False) -> Lookup:
    """A table updated in place, whose primary key starts with k (key[0]), as a stream row sees it
    when it arrives: committed at or before the row's commit timestamp (per primary key, the change
    at the latest position; tombstones delete). Stream-table: the row of its key; `asof`
    (ON l.k = r.k AND r.t <= l.t): of its key's rows with t <= its own, the largest t, and of
    equal t the latest arrival. A row is decided iff its commit timestamp is at most the newest
    table commit timestamp or the newest stream commit timestamp minus `skew`."""
    clock = [max(e.pos[0] for e in stream) - skew] if stream else []
    known = max([c.pos[0] for c in table] + clock)

    def lookup(e: Event, key: str | None) -> tuple[bool, Change | None]:
        state = {}
        for c in sorted((c for c in table if c.pos[0] <= e.pos[0]), key=lambda c: c.pos):
            state[c.key] = c
        candidates = [
            c for c in state.values() if not c.deleted and c.key[0] == key and (not asof or c.t <= e.t)
        ]
        return e.pos[0] <= known, max(candidates, key=lambda c: (c.t, c.pos), default=None)

    return lookup


Link = tuple[str, Lookup, Callable[[Event, list[Change | None]], str | None]]  # how, lookup, its key


def chain_reference(
    stream: list[Event], links: list[Link], closed: bool = False
) -> tuple[Counter, dict[str, int], list[dict[str, int]]]:
    """A stream enriched by tables in turn: (output multiset of (stream id, each link's id or None,
    time), stream counts, counts per link). Rows with a NULL key or time are rejected. A row is decided iff every
    link decides it (a `closed` input decides every row), else open. Each link looks up its key
    (from the row or an earlier link's match, NULL when that link padded): an INNER link without
    a match drops the row, a LEFT link pads it. A row is joined when it matched at every link,
    unmatched_emitted when it came out padded. Per link: the decided rows that reached it (not
    dropped by an earlier INNER link), matched, padded (LEFT) or dropped (INNER) there."""
    counts = dict.fromkeys(STREAM_BUCKETS, 0)
    per_link = [dict.fromkeys(LINK_BUCKETS, 0) for _ in links]
    out = Counter()
    for e in stream:
        counts["rows_in"] += 1
        if e.key is None or e.t is None:
            counts["rejected"] += 1
            continue
        decided, matches = look_up(e, links)
        if not (closed or decided):
            counts["open"] += 1
            continue
        if count_links(matches, links, per_link):
            counts["unmatched_dropped"] += 1
        else:
            counts["joined" if all(m is not None for m in matches) else "unmatched_emitted"] += 1
            out[(e.id, *(None if m is None else m.id for m in matches), e.t)] += 1
    return out, counts, per_link


def look_up(e: Event, links: list[Link]) -> tuple[bool, list[Change | None]]:
    """Row `e` looked up by each link in turn, a link's key taken from the row or an earlier
    link's match: (every link has decided it, each link's match or None)."""
    matches: list[Change | None] = []
    decided = True
    for _how, lookup, key in links:
        link_decided, match = lookup(e, key(e, matches))
        decided = decided and link_decided
        matches.append(match)
    return decided, matches


def count_links(matches: list[Change | None], links: list[Link], per_link: list[dict[str, int]]) -> bool:
    """Count a decided row at each link it reaches (matched, padded by a LEFT link, dropped by an
    INNER one, which it then goes no further than); True when an INNER link dropped it."""
    for match, (how, _, _), link in zip(matches, links, per_link, strict=True):
        link["reached"] += 1
        link["matched" if match is not None else "padded" if how == "left" else "dropped"] += 1
        if match is None and how == "inner":
            return True
    return False


def later_link(taken: dict[str, int]) -> dict[str, int]:
    """A stream-stream link after another link counts the rows it took (its side 0): reached,
    matched, padded, dropped (late, or unmatched on a side it does not keep), open."""
    return {
        "reached": sum(taken[b] for b in ("late", "joined", "unmatched_emitted", "unmatched_dropped")),
        "matched": taken["joined"],
        "padded": taken["unmatched_emitted"],
        "dropped": taken["late"] + taken["unmatched_dropped"],
        "open": taken["open"],
    }


def first_link(emitted: list[tuple[tuple, tuple[int, int, int]]]) -> dict[str, int]:
    """A chain's first (stream-stream) link counts the rows it emits: pairs matched, the others padded."""
    pairs = sum(1 for (lid, rid, _), _ in emitted if lid is not None and rid is not None)
    return {
        "reached": len(emitted),
        "matched": pairs,
        "padded": len(emitted) - pairs,
        "dropped": 0,
        "open": 0,
    }


def interval_chain_reference(
    events: list[Event],
    interval: dict,
    links: list[Link],
    on: str = "l",
    closed: bool = False,
    as_of: str | None = None,
) -> tuple[Counter, dict[int, dict[str, int]], list[dict[str, int]]]:
    """Streams 0 and 1 joined (`reference`'s semantics, keyword arguments `interval`), then each
    emitted row looked up by `links` in turn (`chain_reference`'s rules), as a stream row would be
    at its emission position and output time (`emissions`): (output multiset of (left id, right
    id, each link's id or None, time), counts per stream side, counts per link). A row's key is
    that of its `on` side ("l" or "r"; NULL when that side was padded). With `as_of` ("l" or "r",
    `as_of: l.t`), the links look the row up at that side's time, not its output time: a row
    whose side was padded has no such time and matches nothing (decided as at its output time).
    The first link counts emitted rows: matched (pairs), padded; later links count the rows they
    decided, and the first of them the rows still waiting for a table (`open`)."""
    emitted, counts = emissions(events, closed=closed, **interval)
    keys = {e.id: e.key for e in events}
    times = {e.id: e.t for e in events}
    per_link = [first_link(emitted)]
    per_link += [dict.fromkeys((*LINK_BUCKETS, "open"), 0) for _ in links]
    out = Counter()
    for (lid, rid, t), pos in emitted:
        mine = lid if on == "l" else rid
        named = None if as_of is None else (lid if as_of == "l" else rid)
        point = t if named is None else times[named]
        row = Event(0, f"{lid}|{rid}", None if mine is None else keys[mine], point, pos)
        decided, matches = look_up(row, links)
        if as_of is not None and named is None:  # no time to look the row up at: no version
            matches = [None for _ in links]
        if not (closed or decided):
            per_link[1]["open"] += 1
            continue
        if not count_links(matches, links, per_link[1:]):
            out[(lid, rid, *(None if m is None else m.id for m in matches), t)] += 1
    return out, counts, per_link


def interval_chain_of_three(
    events: list[Event], first: dict, second: dict, on: str = "l", closed: bool = False
) -> tuple[Counter, dict[int, dict[str, int]], list[dict[str, int]]]:
    """Streams 0 and 1 joined (`emissions`, keyword arguments `first`), then each emitted row
    joined with stream 2 (`second`) as a stream row at its emission position and output time,
    keyed by its `on` side ("l" or "r"; NULL when that side was padded); the frontier, clock and
    watermarks of both links are those of all three streams. (Output multiset of (id 0, id 1,
    id 2, time), counts per stream, counts per link: the first counts its emitted rows, the second
    the rows it took: matched, padded, dropped (late or unmatched), open.)"""
    emitted, counts = emissions(
        [e for e in events if e.side < 2], closed=closed, world=events, sources=3, **first
    )
    keys = {e.id: e.key for e in events}
    joined = []
    for (lid, rid, t), pos in emitted:
        mine = lid if on == "l" else rid
        joined.append(Event(0, (lid, rid), None if mine is None else keys[mine], t, pos))
    third = [replace(e, side=1) for e in events if e.side == 2]
    out, later = emissions(joined + third, closed=closed, world=events, sources=3, derived=True, **second)
    links = [first_link(emitted), later_link(later[0])]
    rows = Counter()
    for (left, cid, t), _ in out:
        rows[(*(left or (None, None)), cid, t)] += 1
    return rows, {0: counts[0], 1: counts[1], 2: later[1]}, links


def enrichment_then_interval(
    events: list[Event], links: list[Link], second: dict, closed: bool = False
) -> tuple[Counter, dict[int, dict[str, int]], list[dict[str, int]]]:
    """Stream 0 looked up in tables by `links` (`chain_reference`'s rules), then joined with stream
    2 (`emissions`, keyword arguments `second`) ON their keys: ksqlDB's `FROM A JOIN B JOIN C
    WITHIN ...`, B a table. Both streams settle by their frontier; an enriched row is a row at its
    stream row's position and time, judged late by the second link's grace at that position. A
    stream row the tables cannot decide yet waits (open); while it would be on time at the second
    link, a stream-2 row within its bounds stays open too, for it may still come. (Output multiset
    of (id 0, each table's id or None, id 2, time), counts per stream side, counts per link: the
    tables', the first with the rows still waiting (open), then the stream-stream link's as in
    `interval_chain_of_three`.)"""
    newest: dict[int, tuple[int, int, int]] = {}
    for e in events:
        newest[e.side] = max(newest.get(e.side, e.pos), e.pos)
    frontier = min(newest.values()) if len(newest) == 2 else None

    def is_settled(e: Event) -> bool:
        return closed or (frontier is not None and e.pos <= frontier)

    accepted = [e for e in events if e.key is not None and e.t is not None and is_settled(e)]
    counts = dict.fromkeys(BUCKETS, 0)
    per_link = [dict.fromkeys((*LINK_BUCKETS, "open"), 0) for _ in links]
    enriched, waiting = [], []
    for e in (e for e in events if e.side == 0):
        counts["rows_in"] += 1
        if e.key is None or e.t is None:
            counts["rejected"] += 1
            continue
        if not is_settled(e):
            counts["unsettled"] += 1
            continue
        decided, matches = look_up(e, links)
        if not (closed or decided):
            counts["open"] += 1
            per_link[0]["open"] += 1
            before = [o.t for o in accepted if o.pos < e.pos]
            if (
                second.get("mode", "exact") == "complete"
                or not before
                or e.t >= max(before) - second["grace"]
            ):
                waiting.append(e.t)
            continue
        if count_links(matches, links, per_link):
            counts["unmatched_dropped"] += 1
            continue
        counts["joined" if all(m is not None for m in matches) else "unmatched_emitted"] += 1
        enriched.append(Event(0, (e.id, *(None if m is None else m.id for m in matches)), e.key, e.t, e.pos))
    third = [replace(e, side=1) for e in events if e.side == 2]
    out, later = emissions(
        enriched + third, closed=closed, world=events, derived=True, waiting=tuple(waiting), **second
    )
    per_link.append(later_link(later[0]))
    width = len(links) + 1
    rows = Counter()
    for (left, cid, t), _ in out:
        rows[(*(left or (None,) * width), cid, t)] += 1
    return rows, {0: counts, 2: later[1]}, per_link


def by_stream_key(e: Event, matches: list[Change | None]) -> str | None:
    """A link ON l.k = <table>.k."""
    return e.key


def temporal_reference(
    stream: list[Event],
    table: list[Change],
    grace: int,
    how: str,
    mode: str = "exact",
    in_place: bool = False,
    closed: bool = False,
) -> tuple[Counter, dict[str, int], dict[str, int]]:
    """Event-time temporal join (FOR SYSTEM_TIME AS OF l.t) of `stream` with a changelog
    (`temporal_table`): (output, stream counts, table counts). A `closed` input (it has ended)
    decides every row."""
    t_counts, lookup = temporal_table(table, grace, mode, in_place)
    out, s_counts, _ = chain_reference(stream, [(how, lookup, by_stream_key)], closed)
    return out, s_counts, t_counts


def history_asof_reference(
    stream: list[Event],
    table: list[Change],
    grace: int,
    how: str,
    following: bool,
    mode: str = "exact",
    in_place: bool = False,
    closed: bool = False,
) -> tuple[Counter, dict[str, int], dict[str, int]]:
    """ASOF over the table's history (`history_asof_table`): (output, stream counts, table counts)."""
    t_counts, lookup = history_asof_table(table, grace, following, mode, in_place)
    out, s_counts, _ = chain_reference(stream, [(how, lookup, by_stream_key)], closed)
    return out, s_counts, t_counts


def asof_reference(
    stream: list[Event],
    table: list[Change],
    how: str,
    skew: int = 0,
) -> tuple[Counter, dict[str, int]]:
    """ASOF join ON l.k = r.k AND r.t <= l.t against a table updated in place (`arrival_table`):
    (output, stream counts)."""
    out, counts, _ = chain_reference(
        stream, [(how, arrival_table(table, stream, skew, asof=True), by_stream_key)]
    )
    return out, counts


def lateral_reference(
    rows: list[tuple[str, object, int | None]], how: str, made: Callable[[object], list[tuple]], width: int
) -> tuple[Counter, dict[str, int]]:
    """UNNEST and table-function joins: rows (id, value, seconds; a NULL time is rejected) each
    joined with the `made(value)` rows (tuples of `width` columns); INNER drops a row that makes
    none, LEFT writes it once padded with NULLs. Output: (id, *made columns, seconds)."""
    output: Counter = Counter()
    counts = dict.fromkeys(BUCKETS, 0)
    for id_, value, t in rows:
        counts["rows_in"] += 1
        if t is None:
            counts["rejected"] += 1
            continue
        items = made(value)
        if items:
            counts["joined"] += 1
            output.update((id_, *item, t) for item in items)
        elif how == "left":
            counts["unmatched_emitted"] += 1
            output[(id_, *([None] * width), t)] += 1
        else:
            counts["unmatched_dropped"] += 1
    return output, counts
