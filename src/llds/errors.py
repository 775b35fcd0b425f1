"""Errors that carry a message meant for the user (the CLI prints it without a traceback)."""

from __future__ import annotations


class UserInputError(ValueError):
    """Bad user input: a file, key, field or value. The message names which one."""


class ConfigError(UserInputError):
    """An invalid configuration key or value; the message names the dotted key."""


class DataFormatError(UserInputError):
    """A data file does not match its expected schema; the message names file, row and field."""


class ServiceUnavailableError(UserInputError):
    """A service the command needs (the retriever) stayed unreachable; the message names it and
    says how to go on. Not a bug, so the CLI shows the message without a traceback."""


class WriteFailedError(UserInputError):
    """A file could not be written (a full disk, a quota, a permission); the message names it and
    says what was kept. Not a bug, so the CLI shows the message without a traceback."""

    def __init__(self, message: str, *, path: object = None, why: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.why = why
