"""The reader's errors: why a file is not a usable flight-recorder dump.

Exception tree:

    DumpError                 the file is not a usable dump; the message says why
    ├── UnsafePickleError     the pickle asks for a global/persistent object (refused)
    ├── TruncatedDumpError    empty, cut short or half-written
    ├── NotADumpError         readable data, but not a flight-recorder dump
    ├── UnsupportedVersionError  a schema version other than 2.x
    ├── DumpTooLargeError     over the configured size limit
    ├── InvalidDumpError      values the store cannot hold (`flightdeck.snapshot_check`)
    ├── DumpBudgetError       decodes to more than one file may cost (entries, frames, shared
    │                         references): refused before it is normalized
    └── NotRegularFileError   a FIFO, socket, device, directory or symlink: never opened (a FIFO
                              would block the reader until someone writes to it)
"""

from __future__ import annotations


class DumpError(Exception):
    """A file that is not a usable flight-recorder dump."""


class UnsafePickleError(DumpError):
    """The pickle references a global or persistent object; refused without executing anything."""


class TruncatedDumpError(DumpError):
    """The file is empty, cut short or still being written."""


class NotADumpError(DumpError):
    """The data is readable but not a flight-recorder dump."""


class UnsupportedVersionError(DumpError):
    """The dump's schema version is not a 2.x version."""


class DumpTooLargeError(DumpError):
    """The file exceeds the size limit."""


class InvalidDumpError(DumpError):
    """A dump whose values the store cannot hold (`flightdeck.snapshot_check`): set aside alone."""


class DumpBudgetError(DumpError):
    """The dump decodes to more than one file may cost to normalize (see `DumpBudget`)."""


class NotRegularFileError(DumpError):
    """The path is not a regular file; `kind` says what it is (a bounded label value)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind
