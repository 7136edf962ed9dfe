"""One error type for every bad input: the CLI prints its message as one line and exits 2."""


class MemfitError(ValueError):
    """A problem with what the user asked for; the message names it and what would be valid."""
