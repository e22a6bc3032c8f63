"""User-facing errors shared by every subcommand."""


class CliError(Exception):
    """A user error: printed as one line ``ldpstream: error: ...`` with exit status 2."""
