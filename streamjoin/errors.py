"""The errors streamjoin raises: each says what is wrong and what to change."""


class StreamJoinError(Exception):
    """Base of every error streamjoin raises on purpose."""


class SetupError(StreamJoinError):
    """The machine is not set up (missing jars, packages)."""


class JobError(StreamJoinError):
    """A job cannot run as written; raised before any data moves."""


class UnsupportedJobError(JobError):
    """A runner cannot run this job (a join family or combination it does not support yet)."""


class HistoryNotRetainedError(StreamJoinError):
    """A replay needs Delta history (log or data files) that is no longer retained."""


class CheckpointError(StreamJoinError):
    """A live checkpoint cannot go on as it is (one of its files is unreadable); says what to do."""
