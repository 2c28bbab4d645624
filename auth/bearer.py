"""The server interceptor that checks ``authorization: Bearer TOKEN``, and the client
interceptor that sends it (with any other fixed call metadata)."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

API_KEY_ENV = "SPECDEC_API_KEY"
OWNER_KEY = "x-specdec-coordinator"  # which coordinator a model-service call comes from
INTERNAL_TOKEN_ENV = "SPECDEC_INTERNAL_TOKEN"
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _offered_token(metadata: Any) -> str:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    return ""


class BearerTokenServerInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without the token with UNAUTHENTICATED; ``who`` names, in the error
    message, who is expected to hold it."""

    def __init__(self, token: str, who: str) -> None:
        if not token:
            raise ValueError("an empty token would let anyone in")
        self._token = token.encode()
        self._message = f"missing or wrong bearer token: {who}"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(OPEN_SERVICES):
            return handler
        offered = _offered_token(details.invocation_metadata).encode()
        if hmac.compare_digest(offered, self._token):
            return handler
        return self._refusal(handler)

    def _refusal(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        message = self._message

        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        if not handler.response_streaming:
            return grpc.unary_unary_rpc_method_handler(
                refuse,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )

        async def refuse_stream(request: Any, context: grpc.aio.ServicerContext):
            await refuse(request, context)
            yield  # pragma: no cover (abort raises)

        streaming = (
            grpc.stream_stream_rpc_method_handler
            if handler.request_streaming
            else grpc.unary_stream_rpc_method_handler
        )
        return streaming(
            refuse_stream,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class CallMetadataInterceptor(grpc.aio.UnaryUnaryClientInterceptor):
    """Adds fixed metadata (a bearer token, the caller's identity) to every unary call of
    an aio channel."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    async def intercept_unary_unary(self, continuation, client_call_details, request):
        metadata = tuple(client_call_details.metadata or ()) + self._metadata
        details = grpc.aio.ClientCallDetails(
            client_call_details.method,
            client_call_details.timeout,
            metadata,
            client_call_details.credentials,
            client_call_details.wait_for_ready,
        )
        return await continuation(details, request)


def bearer(token: str) -> tuple[str, str]:
    """The metadata pair that carries ``token``."""
    return ("authorization", f"Bearer {token}")
