"""TLS for the gRPC hops: credentials from PEM files.

The coordinator's public port serves TLS with ``--tls-cert/--tls-key``. ``--tls-ca`` turns
on mutual TLS on the internal hops: each model service then serves TLS with its own
``--tls-cert/--tls-key`` and accepts only clients whose certificate that CA signed, and
the coordinator verifies the services against it and presents its own certificate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"cannot read TLS file {path!r}: {e.strerror}") from None


@dataclass(frozen=True)
class TLSFiles:
    """PEM paths; empty strings mean "not given"."""

    cert: str = ""
    key: str = ""
    ca: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.ca and not self.cert:
            raise ValueError("--tls-ca (mutual TLS) needs this process's --tls-cert/--tls-key")

    @property
    def serves_tls(self) -> bool:
        return bool(self.cert)

    def server_credentials(self, require_client_cert: bool) -> grpc.ServerCredentials:
        """This process's certificate; with ``require_client_cert`` only clients the CA
        signed are let in."""
        return grpc.ssl_server_credentials(
            [(_read(self.key), _read(self.cert))],
            root_certificates=_read(self.ca) if require_client_cert else None,
            require_client_auth=require_client_cert,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Verify the server against the CA and present this process's certificate."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca),
            private_key=_read(self.key),
            certificate_chain=_read(self.cert),
        )
