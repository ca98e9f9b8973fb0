"""A submitted job's ties to ``substreams submit``: die with its parent, and leave the
user's error where ``submit`` finds it.

Why: ``substreams submit`` runs ``spark-submit`` (a JVM) which runs the Python driver.  A
driver that outlives a killed ``submit`` keeps running and committing, unseen (issue 43).
``submit`` puts the JVM in a process group it signals and asks the kernel to SIGKILL it
when ``submit`` dies (``PR_SET_PDEATHSIG``); the Python driver, the JVM's child, asks the
same of the JVM here.  And a failed job's own error (a stream, a field, a value) sits in a
traceback inside hundreds of lines of Spark log: the driver writes it to the file
``submit`` names, which prints it first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import sys

ENV_DIE_WITH_PARENT = "SUBSTREAMS_DIE_WITH_PARENT"
"""Set by ``substreams submit``: the signal (a number) the driver asks for when its parent
(the spark-submit JVM) dies."""
ENV_ERROR_FILE = "SUBSTREAMS_ERROR_FILE"
"""Set by ``substreams submit``: where the driver writes the user's error of a failed run."""

_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(signum: int) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent dies (False where
    there is no ``prctl``).  Safe in a ``preexec_fn``: no allocation beyond ctypes'."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return int(libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)) == 0


def die_with_parent() -> None:
    """Under ``substreams submit``: end when the JVM that started this driver ends (also
    when it was SIGKILLed and could not stop its children).  A no-op elsewhere."""
    wanted = os.environ.get(ENV_DIE_WITH_PARENT)
    if not wanted:
        return
    parent = os.getppid()
    if set_parent_death_signal(int(wanted)) and os.getppid() != parent:
        os.kill(os.getpid(), int(wanted))  # the parent died before the request took


_ERROR_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception)): (.+)$",
                         re.MULTILINE)


def user_error(exc: BaseException) -> str:
    """The user's error inside ``exc``: a substreams error's own message, found also in a
    Spark error's text (a task's Python traceback travels inside it); else its first line."""
    from substreams import errors

    ours = {name for name, value in vars(errors).items()
            if isinstance(value, type) and issubclass(value, errors.SubstreamsError)}
    ours |= {"OperatorOutputError"}
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, errors.SubstreamsError):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    found = [m for m in _ERROR_LINE.finditer(text) if m.group(1) in ours]
    if found:
        return found[-1].group(2).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first or type(exc).__name__


def record_user_error(exc: BaseException) -> None:
    """Write the user's error of ``exc`` where ``substreams submit`` reads it (if it
    asked): one line, the first thing it prints about a failed job."""
    path = os.environ.get(ENV_ERROR_FILE)
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(user_error(exc).replace("\n", " ") + "\n")
    except OSError:
        pass
