"""Domain errors as gRPC status codes (the one place)."""

from __future__ import annotations

import logging

import grpc

from specdec.kernels.paged_kv_cache import OutOfPagesError
from specdec.runtime.errors import InvalidRequestError, OutOfSyncError, UnknownRequestError
from specdec.runtime.kv_scales import KVScalesMismatchError

log = logging.getLogger(__name__)

STATUS_CODES: dict[type[BaseException], grpc.StatusCode] = {
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownRequestError: grpc.StatusCode.NOT_FOUND,
    OutOfSyncError: grpc.StatusCode.FAILED_PRECONDITION,
    KVScalesMismatchError: grpc.StatusCode.FAILED_PRECONDITION,
    OutOfPagesError: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def status_code_for(exc: BaseException) -> grpc.StatusCode:
    for kind, code in STATUS_CODES.items():
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


def refusal(exc: BaseException, where: object) -> tuple[grpc.StatusCode, str]:
    """The status code and message that refuse a call ``exc`` ended; an unexpected error
    (INTERNAL) is logged with its traceback, naming ``where`` it happened."""
    code = status_code_for(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.error("unexpected error in %s", where, exc_info=exc)
    return code, str(exc) or type(exc).__name__
