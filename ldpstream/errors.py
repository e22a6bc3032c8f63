"""User-facing errors shared by every subcommand."""


class CliError(Exception):
    """A user error: printed as one line ``ldpstream: error: ...`` with exit status 2."""


class ServiceError(RuntimeError):
    """A service (Kafka, Redis, an embedded child) cannot be found, started or reached (the
    message says which and why)."""
