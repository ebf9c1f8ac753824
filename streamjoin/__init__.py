"""streamjoin: streaming joins written once, run live on Spark Structured Streaming or replayed
deterministically over Delta snapshots."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("streamjoin")
except PackageNotFoundError:  # a checkout used without installing it
    __version__ = "0+unknown"
