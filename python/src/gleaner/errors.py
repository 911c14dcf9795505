"""The errors of gleaner's commands, one class per exit code."""

from __future__ import annotations

from typing import Any, Optional


class GleanerError(Exception):
    """gleaner could not do what was asked; `code` is the CLI's exit code."""

    def __init__(self, message: str, *, code: Optional[int] = None, stderr: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.stderr = stderr


class Unsuccessful(GleanerError):
    """Exit 1: the job is unknown, or did not fully succeed."""


class BadInput(GleanerError):
    """Exit 2: a manifest, a job id or the configuration is wrong."""


class Unreachable(GleanerError):
    """Exit 3: the broker, or the service that should answer, is not there."""


class Denied(GleanerError):
    """Exit 4: the broker or the scheduler refused (the job is another's)."""


class JobFailed(Unsuccessful):
    """A job ended without every task succeeding; `report` says how."""

    def __init__(self, report: Any) -> None:
        super().__init__(f"{report.job}: {report.summary()}", code=1)
        self.report = report


class TaskFailed(GleanerError):
    """A Python call's task ended without a value: it failed, timed out, was
    lost or cancelled (after its retries), so its call never returned."""

    def __init__(self, message: str, *, task: int, status: str) -> None:
        super().__init__(message)
        self.task = task
        self.status = status


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a task, as text; it is the
    `__cause__` of the exception a future gives back."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n" + self.text
