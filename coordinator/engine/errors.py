"""Domain errors. They become gRPC status codes in one place (`streaming.status_code`)."""

from __future__ import annotations


class SpecDecError(Exception):
    """Base of the coordinator's errors; the message is for a person to act on."""


class InvalidRequest(SpecDecError):
    """The client's request is malformed or cannot fit the model."""


class ResourceExhausted(SpecDecError):
    """Too many requests are waiting, or a request could never fit the KV cache."""


class Cancelled(SpecDecError):
    """The request was aborted (an Abort call, a stop string, a draining coordinator)."""


class NotReady(SpecDecError):
    """The coordinator is not connected or is draining."""


class ServiceError(SpecDecError):
    """A draft/target RPC failed; `code` is the gRPC status code name it failed with."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
