"""Where the package's log lines go, set up once by each command (`setup_logging`).

By default a run's output is llds's own lines (resume, alarms, warnings) and every library's
warnings and errors: libraries' INFO and DEBUG records are dropped, among them httpx's line for
every retrieval request ("HTTP Request: POST ..."), the access line of a retrieval service
running in the same process, and bm25s's "Building index from tokens" (bm25s sets its own
logger to DEBUG, so a root level of INFO alone lets it through). `verbose=True` (`logging.verbose`
in a training config) shows every library's INFO lines and the DEBUG lines of libraries that set
their loggers to DEBUG.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

OWN_LOGGERS = ("llds", "__main__")
"""Logger names (and their children) whose INFO lines are shown by default."""

_MARK = "_llds_handler"  # set on the handler this module installs, so a second call replaces it


class LibraryFilter(logging.Filter):
    """Passes llds's records at INFO and above and everyone's warnings and errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        return record.levelno >= logging.INFO and is_own(record.name)


class CurrentStdoutHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stdout` is when a record comes, not to the one of the call that
    installed it: a process that replaces standard output later (a capture, a redirect) keeps
    its log lines, and none goes to a stream that was closed meanwhile."""

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return sys.stdout

    @stream.setter
    def stream(self, value: TextIO) -> None:  # StreamHandler.__init__ assigns one: ignored
        pass


def is_own(name: str) -> bool:
    """Whether logger `name` is one of `OWN_LOGGERS` or below one."""
    return any(name == own or name.startswith(own + ".") for own in OWN_LOGGERS)


def setup_logging(verbose: bool = False, *, stream: TextIO | None = None) -> logging.Handler:
    """Send log records to one handler on the root logger and return it.

    `stream=None` writes to standard output, through rich on a terminal; a given stream (a run's
    log file, a test's buffer) and a redirected standard output get plain `message` lines.
    Calling it again replaces the handler it installed before; handlers installed by others
    (pytest, an application) are left alone.
    """
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(old)
        old.close()
    handler: logging.Handler
    if stream is None and _stdout_is_terminal():
        from rich.logging import RichHandler

        handler = RichHandler(show_path=False)
    else:  # a log file or a pipe: whole lines, no columns cut to 80 characters
        handler = CurrentStdoutHandler() if stream is None else logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    if verbose:
        handler.setLevel(logging.DEBUG)
    else:
        handler.setLevel(logging.INFO)
        handler.addFilter(LibraryFilter())
    setattr(handler, _MARK, True)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    return handler


def _stdout_is_terminal() -> bool:
    from rich.console import Console

    return Console().is_terminal
