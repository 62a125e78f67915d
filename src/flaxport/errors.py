"""Errors a user can cause. The CLI prints these as one line and exits non-zero."""


class UserError(Exception):
    """Something the user can fix: bad flag, missing data, wrong checkpoint, NaN loss."""

    exit_code = 2


class TrainingDiverged(UserError):
    """The loss became NaN or inf; the last good checkpoint is kept."""

    exit_code = 3


def first_line(e: BaseException, limit: int = 200) -> str:
    """The first line of `e`'s message, at most `limit` characters (its type's name if it has none)."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:limit]
