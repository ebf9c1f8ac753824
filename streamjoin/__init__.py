"""streamjoin: streaming joins written once, run live on Spark Structured Streaming or replayed
deterministically over Delta snapshots."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("streamjoin")
except PackageNotFoundError:  # a checkout used without installing it
    __version__ = "0+unknown"

__all__ = ["Job", "__version__"]


def __getattr__(name: str):
    """`streamjoin.Job`, imported on first use: `streamjoin --version` and `--help` need none of it."""
    if name == "Job":
        from streamjoin.job import Job

        return Job
    raise AttributeError(f"module 'streamjoin' has no attribute {name!r}")
