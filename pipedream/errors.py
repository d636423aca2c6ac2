"""User-facing errors: one clear line, exit status 2, no traceback.

Every problem caused by bad input (a malformed profile, an unknown model, an impossible plan, a
missing dataset) is raised as :class:`PipeDreamError` with a message that names the problem and the
fix. The command line (:mod:`pipedream.cli`) catches it, prints ``error: <message>`` on stderr and
exits with :data:`EXIT_USAGE`.
"""

from __future__ import annotations

EXIT_USAGE = 2


class PipeDreamError(Exception):
    """Bad input or an impossible request; the message is shown to the user as one line."""
