"""Errors of the model services' requests; each has its gRPC status code in
``model_service.status``."""

from __future__ import annotations


class InvalidRequestError(ValueError):
    """The message is malformed or asks for the impossible (INVALID_ARGUMENT)."""


class UnknownRequestError(KeyError):
    """The service holds no sequence for the request (NOT_FOUND)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class OutOfSyncError(RuntimeError):
    """The service's cache disagrees with the caller's log (FAILED_PRECONDITION)."""
