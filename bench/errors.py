"""The bench's one exception type."""


class BenchError(Exception):
    """The bench itself could not run (set-up failed), as opposed to a row failing."""
