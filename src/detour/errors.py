"""User-facing errors.

Raise `DetourError` for anything a user can fix (a wrong path, a malformed file, a bad recipe
field). The CLI prints its message, without a traceback, and exits with status 2.
"""


class DetourError(Exception):
    """An error caused by the user's input; its message says what and where."""


class NoSpaceError(DetourError):
    """A write ran out of disk space (the message from detour.io.no_space); nothing half-written was kept."""
