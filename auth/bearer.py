"""The server interceptor that checks ``authorization: Bearer TOKEN``, and the client
interceptor that sends it (with any other fixed call metadata)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

API_KEY_ENV = "SPECDEC_API_KEY"
OWNER_KEY = "x-specdec-coordinator"  # which coordinator a model-service call comes from
INTERNAL_TOKEN_ENV = "SPECDEC_INTERNAL_TOKEN"
OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def coordinator_credential(secret: str, name: str) -> str:
    """The internal token of the coordinator ``name``: ``NAME.MAC``, the name and its MAC
    under the stack's ``secret``. A model service that knows the secret takes the name a
    credential proves as the caller's identity, whatever the call claims, so a coordinator
    holding its own credential cannot act for another (``specdec up`` hands one to each)."""
    mac = hmac.new(secret.encode(), name.encode(), hashlib.sha256).hexdigest()
    return f"{name}.{mac}"


def proven_name(metadata: Any, secret: str) -> str | None:
    """The coordinator name the call's credential proves under ``secret``; None when it
    offers none (the stack's secret itself, whose holder may name any coordinator)."""
    offered = offered_token(metadata)
    name, dot, _ = offered.rpartition(".")
    if not (secret and dot and name):
        return None
    expected = coordinator_credential(secret, name).encode()
    return name if hmac.compare_digest(expected, offered.encode()) else None


def offered_token(metadata: Any) -> str:
    """The bearer token of a call's metadata ("" for none)."""
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    return ""


def split_keys(keys: str) -> tuple[str, ...]:
    """The keys of a comma-separated ``--api-key`` value."""
    return tuple(k.strip() for k in keys.split(",") if k.strip())


def key_scope(metadata: Any) -> str:
    """A short name for the bearer token a call offered ("" for none): requests made with
    different keys stay apart without the key itself being kept."""
    offered = offered_token(metadata)
    return hashlib.sha256(offered.encode()).hexdigest()[:12] if offered else ""


class BearerTokenServerInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls without one of the tokens with UNAUTHENTICATED; ``who`` names, in the
    error message, who is expected to hold it.

    The refusal never reads the request: its handler takes a request stream it does not
    consume and has no deserializer, so an unauthenticated message is neither buffered
    whole nor parsed (gRPC's flow control stops the sender after its first window)."""

    def __init__(
        self,
        tokens: str | tuple[str, ...],
        who: str,
        open_services: tuple[str, ...] = (),
        credentials_of: str = "",
    ) -> None:
        """``open_services``: method prefixes let in without a token, beside health and
        reflection. ``credentials_of``: a secret whose coordinator credentials
        (`coordinator_credential`) are let in too."""
        tokens = (tokens,) if isinstance(tokens, str) else tokens
        if not tokens or not all(tokens):
            raise ValueError("an empty token would let anyone in")
        self._tokens = tuple(t.encode() for t in tokens)
        self._message = f"missing or wrong bearer token: {who}"
        self._open = OPEN_SERVICES + open_services
        self._secret = credentials_of
        self._refusal = grpc.stream_unary_rpc_method_handler(self._refuse)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(self._open):
            return handler
        metadata = details.invocation_metadata
        offered = offered_token(metadata).encode()
        # Every token is compared, so the time taken does not say which one came close.
        if sum(hmac.compare_digest(offered, token) for token in self._tokens):
            return handler
        if self._secret and proven_name(metadata, self._secret) is not None:
            return handler
        return self._refusal

    async def _refuse(self, requests: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, self._message)


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
