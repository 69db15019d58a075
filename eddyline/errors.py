"""One error root for Eddyline, classified by whose fault it is.

``SpecError`` is the user's (a network spec that cannot run); it is raised before any epoch runs
and the CLI maps it to exit code 2. ``SourceError`` / ``SinkError`` are external systems;
``CheckpointError`` means the checkpoint on disk does not fit the network or is damaged;
``EngineError`` is a bug or an unexpected Spark failure.
"""

from __future__ import annotations


class EddylineError(Exception):
    """Root of every error Eddyline raises on purpose."""

    retryable: bool = False


class SpecError(EddylineError):
    """A network spec is invalid. ``problems`` holds every message, each naming the step and field.

    >>> str(SpecError(["step 'w': window.size: expected a duration like '10s', got 'ten'"]))
    "step 'w': window.size: expected a duration like '10s', got 'ten'"
    """

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class CheckpointError(EddylineError):
    """The checkpoint location does not belong to this network or is inconsistent."""


class SourceError(EddylineError):
    """A source could not be read (missing directory, unreadable file ...)."""

    retryable = True


class SourceUnreachable(SourceError):
    """A source's server could not be reached within the time it was given to answer."""

    def __init__(self, source: str, message: str):
        self.source = source
        super().__init__(message)


class StoreUnreachable(EddylineError):
    """An object store did not answer a request in time (or its connection failed)."""


class SinkError(EddylineError):
    """A sink could not be written or published."""

    retryable = True


class Fenced(EddylineError):
    """A newer lease generation took over: this driver must stop without writing anything more.
    Raised by the lease when the driver looks (:mod:`eddyline.ha.lease`), and by a store that
    refused the write of an older generation (:class:`eddyline.storage.Gate`, the sinks)."""


class EngineError(EddylineError):
    """Something inside Eddyline or Spark failed unexpectedly."""


#: Prefix of a message raised inside a Spark task that names the step; the driver finds the line
#: in Spark's Python traceback (:func:`task_error_line`) and shows only that.
TASK_MARK = "eddyline:"


def task_error_line(error: BaseException) -> str | None:
    """The ``eddyline:`` line inside a Spark task failure, if there is one."""
    for line in str(error).splitlines():
        if TASK_MARK in line:
            return line[line.index(TASK_MARK) + len(TASK_MARK) :].strip()
    return None


class LaneStepError(RuntimeError):
    """A stateless step's own code (a udf's function) failed on a resident lane's rows. Its
    message is the one a per-epoch job's failed task leaves (marked :data:`TASK_MARK`), and the
    driver surfaces it as such a failure is (an :class:`EngineError` naming the epoch), not as a
    lane to start again: the same rows fail the same way."""
