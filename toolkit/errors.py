"""One exception type for every error a user can cause.

The CLI prints `error: <message>` on one line and exits with code 2 for a
ToolkitError (a traceback only with --debug); anything else is a bug and keeps
its traceback.
"""


class ToolkitError(Exception):
    """A user-facing error: bad input, a missing file, an unsupported model."""
