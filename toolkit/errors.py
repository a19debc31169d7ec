"""One exception type for every error a user can cause: the CLI prints it as one `error:` line and exits 2
(toolkit/cli/common.py run(), which maps every other exception to its exit code too)."""


class ToolkitError(Exception):
    """A user-facing error: bad input, a missing file, an unsupported model."""
