"""Shared behaviour of the command-line entry points: one-line errors, non-zero exit."""

import functools
import sys

from anchormass.errors import AnchorMassError


def exit_on_error(fn):
    """Run `fn`; an `AnchorMassError` becomes `error: <message>` on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except AnchorMassError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)

    return wrapper
