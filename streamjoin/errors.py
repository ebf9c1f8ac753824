"""The errors streamjoin raises: each says what is wrong and what to change (storage faults
become StorageError in `delta_io.storage_fault`)."""


class StreamJoinError(Exception):
    """Base of every error streamjoin raises on purpose."""

    exit_code = 2  # what the CLI exits with after printing the message


class SetupError(StreamJoinError):
    """The machine is not set up (missing jars, packages)."""


class JobError(StreamJoinError):
    """A job cannot run as written; raised before any data moves."""


class DefinitionChangedError(JobError):
    """The job's definition changed since its output, index or checkpoint was written; rows would differ."""


class UnsupportedJobError(JobError):
    """A runner cannot run this job (a join family or combination it does not support yet)."""


class HistoryNotRetainedError(StreamJoinError):
    """A replay needs Delta history (log or data files) that is no longer retained."""


class CheckpointError(StreamJoinError):
    """A live checkpoint cannot go on as it is (one of its files is unreadable); says what to do."""


class StorageError(StreamJoinError):
    """Storage failed a read or a write: no space left, a folder that cannot be written, a damaged
    Delta log entry. Delta commits are atomic: a failed write leaves its table as it was."""


class UnbalancedRunError(StreamJoinError):
    """A run's accounting does not add up: some rows it read ended in no bucket. The run failed
    (exit 1), though what it wrote stays written until it is run again."""

    exit_code = 1


# A backfill's exit code when no slice failed but some are invalid (their rows were written and failed
# validation): running them again would validate the same rows, so a scheduler does not retry it.
EXIT_INVALID = 3
