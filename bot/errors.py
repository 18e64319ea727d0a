"""The one error family of review-bot; adapters translate library errors into these."""

from __future__ import annotations


class ReviewBotError(Exception):
    """Base of every error the bot raises on purpose."""


class ConfigError(ReviewBotError):
    """Configuration or policy is invalid; start-up stops with this message."""


class PolicyError(ConfigError):
    """A policy file is broken; the message names the file, line and problem."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        where = path or "<policy>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line


class StartError(ReviewBotError):
    """A part of a process did not start; the parts started before it were stopped again."""

    def __init__(self, part: str, cause: BaseException) -> None:
        # Our own errors say what to fix; anything else is named by its type too.
        said = (
            str(cause) if isinstance(cause, ReviewBotError) else f"{type(cause).__name__}: {cause}"
        )
        super().__init__(f"{part} did not start: {said}")
        self.part = part


class WebhookError(ReviewBotError):
    """A webhook delivery was refused; `status` is the HTTP status to answer."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class StoreError(ReviewBotError):
    """The queue store failed."""


class StoreUnavailable(StoreError):
    """The database cannot be reached; callers answer 503 or retry later."""


class LeaseLost(StoreError):
    """A chunk's lease expired or was taken by another worker before it was finished."""


class ForgeError(ReviewBotError):
    """A forge API call failed."""

    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status >= 500 or self.status in (403, 429)


class ForgeNotFound(ForgeError):
    """The PR, repository or installation is gone; the job ends cancelled."""


class LLMError(ReviewBotError):
    """An LLM backend call failed after its retries."""

    def __init__(self, message: str, *, retryable: bool = True, overloaded: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable
        # The server refused for load (429, 503) or timed out: its window should shrink.
        self.overloaded = overloaded


class LLMRequestRejected(LLMError):
    """The model server refused this request itself (a 4xx such as a prompt over the context
    length): no retry or other worker will take it, but the rest of the review can go on."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class BackendUnavailable(LLMError):
    """The chosen LLM backend cannot be used here (e.g. vLLM not installed)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)
