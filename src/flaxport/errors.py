"""Errors a user can cause. The CLI prints these as one line and exits non-zero."""


class UserError(Exception):
    """Something the user can fix: bad flag, missing data, wrong checkpoint, NaN loss."""

    exit_code = 2


class TrainingDiverged(UserError):
    """The loss became NaN or inf; the last good checkpoint is kept."""

    exit_code = 3
