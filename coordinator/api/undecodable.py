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
from google.protobuf import empty_pb2
from google.protobuf.message import DecodeError


class _Undecodable:
    def __init__(self, reason: str) -> None:
        self.reason = reason


def why_undecodable(data: bytes) -> str:
    """What is wrong with a request that does not parse. Read as a message with no fields
    (every field unknown, so no field's type or UTF-8 is checked), bytes that still fail
    are not protobuf wire format at all: cut short or corrupt."""
    try:
        empty_pb2.Empty().ParseFromString(data)
    except DecodeError:
        return (
            f"the request's {len(data)} bytes are not a whole protobuf message (truncated "
            "or corrupt); send the complete serialized request"
        )
    return (
        "a field of the request has a value its type cannot hold; string fields such as "
        "text must be valid UTF-8"
    )


def _lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError:
            return _Undecodable(why_undecodable(data))

    return deserialize


def _refusing_undecodable(behavior: Callable, streaming: bool) -> Callable:
    async def refuse(request: _Undecodable, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)

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
