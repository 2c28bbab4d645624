"""Bearer-token authentication for the three services' gRPC hops (no torch, like telemetry).

- The public API may require an API key: ``authorization: Bearer KEY`` on every call to the
  coordinator's own services (``SPECDEC_API_KEY`` / ``--api-key``).
- The internal hops carry a token only the stack's processes know
  (``SPECDEC_INTERNAL_TOKEN``, made by ``specdec up``): the model services refuse any other
  caller, so nobody who merely reaches their ports can touch a live sequence. ``specdec
  up`` gives each coordinator its own credential derived from that secret
  (``coordinator_credential``), which proves its name to the services: one coordinator
  cannot release or step another's sequences.

Health checks and server reflection stay open, so probes and ``grpcurl list`` still work.
Tokens are compared in constant time.
"""

from __future__ import annotations

from specdec.auth.bearer import (
    API_KEY_ENV,
    INTERNAL_TOKEN_ENV,
    OWNER_KEY,
    BearerTokenServerInterceptor,
    CallMetadataInterceptor,
    bearer,
    coordinator_credential,
    key_scope,
    proven_name,
    split_keys,
)

__all__ = [
    "API_KEY_ENV",
    "INTERNAL_TOKEN_ENV",
    "OWNER_KEY",
    "BearerTokenServerInterceptor",
    "CallMetadataInterceptor",
    "bearer",
    "coordinator_credential",
    "key_scope",
    "proven_name",
    "split_keys",
]
