"""A live checkpoint's own files, as `streamjoin stream` meets them (issue 77): nothing is written
before the lease is held, an unreadable file of a checkpoint is refused in one line saying what to
do, and a new checkpoint whose sources lost the files of the job's start is told to start later."""

from __future__ import annotations

from pathlib import Path

import yaml
from aging import vacuum
from harness import create_tables, write_commit

from streamjoin import delta_io, lease
from streamjoin.cli import main


def job_file(tmp_path, paths: dict[int, str]) -> str:
    document = {
        "name": "ck",
        "from": "l",
        "sources": {"l": {"path": paths[0], "time": "t"}, "r": {"path": paths[1], "time": "t"}},
        "joins": [{"join": "r", "type": "inner", "on": "l.k = r.k", "within": "5s", "grace": "0s"}],
        "select": ["l.id AS lid", "r.id AS rid"],
        "output": {"path": f"{tmp_path}/out"},
    }
    path = tmp_path / "ck.yaml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


def sources(spark, tmp_path, files: int | None = None) -> dict[int, str]:
    """Both sources with one commit of two rows (l's in `files` files)."""
    paths = create_tables(spark, tmp_path)
    write_commit(spark, paths[0], [("l1", "a", 10, 0), ("l2", "b", 11, 0)], files=files)
    write_commit(spark, paths[1], [("r1", "a", 12, 0), ("r2", "b", 13, 0)])
    return paths


def stream(capsys, job: str, checkpoint: Path, *more: str) -> tuple[int, str]:
    """`streamjoin stream` in this process: its exit code and what it printed on stderr."""
    code = main(["stream", job, "--checkpoint", str(checkpoint), *more])
    return code, capsys.readouterr().err


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamjoin: error: "), err
    return lines[0]


def test_a_second_runner_on_a_held_lease_writes_nothing_and_is_refused_in_one_line(spark, tmp_path, capsys):
    """Nothing of the job (index, output, checkpoint marker) is written before the lease is held:
    a second runner on a new checkpoint gets the lease's line, not a clash of two index writers."""
    job = job_file(tmp_path, create_tables(spark, tmp_path))
    held = tmp_path / "ck" / "streamjoin" / "lease.json"
    token = lease.acquire(held, lambda: True)  # as a first runner, still starting, holds it
    try:
        before = files(tmp_path)
        code, err = stream(capsys, job, tmp_path / "ck")
        assert files(tmp_path) == before
    finally:
        lease.release(held, token)
    assert code == 2 and "is in use by process" in one_line(err)
    assert not delta_io.exists(spark, f"{tmp_path}/out_index")


def test_an_unreadable_file_of_a_checkpoint_is_refused_saying_what_to_do(spark, tmp_path, capsys):
    """An empty marker (a write cut short by a full disk) stops `stream` in one line: a checkpoint
    that never committed a batch is deleted and run again; one that did is restored or replaced."""
    job, checkpoint = job_file(tmp_path, sources(spark, tmp_path)), tmp_path / "ck"
    checkpoint.mkdir()
    (checkpoint / "streamjoin.json").write_text("")
    code, err = stream(capsys, job, checkpoint)
    line = one_line(err)
    assert code == 2 and f"its marker {checkpoint / 'streamjoin.json'} is unreadable (empty)" in line
    assert f"has not committed a micro-batch yet: delete the folder {checkpoint} and run again" in line
    assert files(tmp_path / "ck") == {"streamjoin.json"} and not (tmp_path / "out_index").exists()

    for path in checkpoint.iterdir():  # what the message says
        path.unlink()
    checkpoint.rmdir()
    assert stream(capsys, job, checkpoint)[0] == 0
    marker = (checkpoint / "streamjoin.json").read_text()
    assert not list(checkpoint.rglob("*.tmp"))  # every small file renamed into place
    records = sorted((checkpoint / "streamjoin" / "progress").glob("*.json"))
    for damaged, what, content in (
        (checkpoint / "streamjoin.json", "marker", marker[: len(marker) // 2]),
        (records[-1], "progress record", '{"batch": 0}'),
    ):
        kept = damaged.read_text()
        damaged.write_text(content)
        code, err = stream(capsys, job, checkpoint)
        line = one_line(err)
        assert code == 2 and f"its {what} {damaged} is unreadable" in line
        assert "Restore the file from a copy of the checkpoint" in line
        assert "streamjoin handoff" in line and f"--yes --checkpoint {checkpoint}" in line
        damaged.write_text(kept)


def test_a_new_checkpoint_on_sources_optimized_and_vacuumed_is_told_to_start_later(spark, tmp_path, capsys):
    """Without row tracking a new checkpoint reads each source's commits since the job's start, whose
    files OPTIMIZE and VACUUM removed (of l here): the advice is a later start (`--from` the current versions),
    not the one for a checkpoint that stopped, and following it works."""
    paths = sources(spark, tmp_path, files=2)  # two files, which OPTIMIZE merges
    job, checkpoint = job_file(tmp_path, paths), tmp_path / "ck"
    spark.sql(f"OPTIMIZE delta.`{paths[0]}`")
    vacuum(spark, paths[0])
    code, err = stream(capsys, job, checkpoint)
    line = one_line(err)
    current = ",".join(f"{name}={delta_io.latest_version(spark, paths[n])}" for n, name in enumerate("lr"))
    assert code == 2 and f"Checkpoint {checkpoint} is new" in line and "stopped before them" not in line
    assert f"`streamjoin reset <job file> --yes --checkpoint {checkpoint}`" in line
    assert f"`streamjoin stream <job file> --checkpoint {checkpoint} --from {current}`" in line

    assert main(["reset", job, "--yes", "--checkpoint", str(checkpoint)]) == 0
    assert stream(capsys, job, checkpoint, "--from", current)[0] == 0
    out = {(r.lid, r.rid) for r in delta_io.read_snapshot(spark, f"{tmp_path}/out").collect()}
    assert out == {("l1", "r1"), ("l2", "r2")}
