"""The runners: live (Structured Streaming) and replay (batch over pinned Delta versions).

Each runner holds its whole control flow and no join semantics; both call `streamjoin.kernel`.
"""
