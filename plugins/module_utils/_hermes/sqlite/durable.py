# Copyright: hermes_agent.ops contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small file (a log, a metrics file, a marker) replaced whole: readers see the old text or the new one.

Standard library only, Python 3.9+, no Ansible imports.
"""

from __future__ import annotations

import os
import tempfile


def replace_file(path: str, text: str, mode: int) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync it, set ``mode`` and rename it over
    ``path``: a reader or a crash sees the old file or the whole new one, never a part.

    The temporary file is hidden (``.NAME.XXXXXXXX.tmp``: a collector that reads ``*.prom`` skips
    it), created by ``mkstemp`` (a new name, never an existing file or link, so a folder another
    user can write, such as a Hermes home, cannot aim it elsewhere), and removed again when a step
    fails. The rename is on disk once the caller fsyncs the directory (``sqlite.db.fsync_path``),
    which it does before anything relies on the new text; a caller writing several files fsyncs it once.
    Raises PermissionError where the directory refuses the temporary file (nothing is written then).
    """
    directory, name = os.path.split(path)
    fd, temp = tempfile.mkstemp(prefix=".%s." % name, suffix=".tmp", dir=directory or ".")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)  # the umask may have taken bits away
            os.fsync(handle.fileno())
        os.rename(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
