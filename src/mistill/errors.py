"""Errors a user can act on."""


class UserError(Exception):
    """Bad input a user can fix (a missing file, an unknown id, a malformed line).

    The CLI prints it as one line and exits with status 2; nothing half-written
    is left behind because every artifact is written atomically (`mistill.io`).
    """
