"""Requests that do not parse get INVALID_ARGUMENT, not gRPC's UNKNOWN.

gRPC Python parses a request before any servicer code runs and answers a parse failure
(a string field that is not UTF-8, a truncated message) with UNKNOWN, which tells the
client nothing it can act on. This interceptor swaps each method's parser for one that
hands the failure to a handler that refuses the call with INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError


class _Undecodable:
    def __init__(self, error: DecodeError) -> None:
        self.error = error


def _lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as e:
            return _Undecodable(e)

    return deserialize


def _refusing_undecodable(behavior: Callable, streaming: bool) -> Callable:
    async def refuse(request: _Undecodable, context: grpc.aio.ServicerContext) -> None:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the request does not parse ({request.error}); string fields such as text "
            "must be valid UTF-8",
        )

    if streaming:

        async def stream(request: Any, context: grpc.aio.ServicerContext):
            if isinstance(request, _Undecodable):
                await refuse(request, context)
            async for response in behavior(request, context):
                yield response

        return stream

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            await refuse(request, context)
        return await behavior(request, context)

    return unary


class UndecodableRequestInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        if handler.response_streaming:
            behavior = _refusing_undecodable(handler.unary_stream, streaming=True)
            return handler._replace(
                unary_stream=behavior, request_deserializer=_lenient(handler.request_deserializer)
            )
        behavior = _refusing_undecodable(handler.unary_unary, streaming=False)
        return handler._replace(
            unary_unary=behavior, request_deserializer=_lenient(handler.request_deserializer)
        )
