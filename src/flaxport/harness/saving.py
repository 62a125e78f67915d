"""What every checkpoint store shares (the Orbax one and the file one): the exception for a
checkpoint that does not read back, the OS's words for a failed write, and the mid-save test hook."""
from __future__ import annotations

import os
import re

from flaxport.errors import first_line

# Test hook: seconds to sleep inside every save, after the temporary file is complete and before
# it is renamed, so a test can kill a run mid-save.
SAVE_DELAY_ENV = "FLAXPORT_TEST_SAVE_DELAY"


class Damaged(Exception):
    """A checkpoint that cannot be read back as it was written."""


def os_reason(e: BaseException) -> str:
    """What went wrong writing, in the words of the OS where they can be found."""
    for err in (e, e.__cause__, e.__context__):
        if isinstance(err, OSError) and err.strerror:
            return err.strerror
    text = str(e)
    m = re.search(r"\[Errno (\d+)\]|errno[ =:]+(\d+)|os_error_code='(\d+)'", text)
    if m:
        return os.strerror(int(next(g for g in m.groups() if g)))
    return first_line(e)
