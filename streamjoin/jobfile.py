"""Job files: a folder's YAML and SQL jobs, and loading one by its suffix.

A `.yaml`/`.yml` file holds the mapping `spec.spec_from_dict` reads; a `.sql` file the statements
`sql.spec_from_sql` compiles to that mapping (docs/job-spec.md). Both give the same `JoinSpec`.
"""

from __future__ import annotations

import os
from pathlib import Path

from streamjoin.errors import JobError
from streamjoin.limits import load_yaml
from streamjoin.spec import JoinSpec, spec_from_dict
from streamjoin.sql import spec_from_sql

JOB_SUFFIXES = (".yaml", ".yml", ".sql")


def job_files(folder: str | os.PathLike) -> list[Path]:
    """The job files of a folder, YAML or SQL, in name order."""
    found = Path(folder)
    return sorted(p for p in found.iterdir() if p.suffix.lower() in JOB_SUFFIXES) if found.is_dir() else []


def load_job(path: str | os.PathLike, root: str | os.PathLike | None = None) -> JoinSpec:
    """Load a job file, YAML or SQL (`.sql`, streamjoin/sql.py); relative Delta paths resolve
    against `root` ($STREAMJOIN_ROOT, else ./data)."""
    file = Path(path)
    if not file.exists():
        raise JobError(f"job file {str(file)!r} does not exist")
    if file.suffix.lower() == ".sql":
        spec = spec_from_sql(file.read_text(), origin=str(file))
        return spec.with_root(root or os.environ.get("STREAMJOIN_ROOT", "data"))
    document = load_yaml(file.read_text(), str(file))
    if not isinstance(document, dict):
        raise JobError(f"job file {str(file)!r} must hold a mapping with name, sources, from, joins, output")
    document.setdefault("name", file.stem)
    spec = spec_from_dict(document, origin=str(file))
    return spec.with_root(root or os.environ.get("STREAMJOIN_ROOT", "data"))
