"""One exception type for every user-facing failure.

Command-line entry points catch `AnchorMassError`, print its message as a single line and
exit non-zero; library code raises it (or a subclass) for bad input instead of asserting.
"""


class AnchorMassError(Exception):
    """Bad input or an inconsistent configuration; the message is one human-readable line."""


class ConfigError(AnchorMassError, ValueError):
    """A configuration field is missing, unknown or inconsistent with another."""


class DataError(AnchorMassError):
    """A corpus, token file, tokenizer or metadata sidecar is missing, corrupt or mismatched."""


class CheckpointError(AnchorMassError):
    """A checkpoint is missing, unreadable or does not match the requested model/data."""
