"""TLS on the public port and mutual TLS on the internal hops, with certificates made here."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import grpc
import pytest
from e2e_stack import running_stack

from specdec.client import CoordinatorClient, GenerateParams
from specdec.v1 import common_pb2, target_pb2_grpc

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_pki(folder, label: str) -> dict[str, str]:
    """A CA and one certificate it signed for 127.0.0.1 / localhost, usable by servers and
    clients alike; returns the PEM file paths."""
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = dict(not_valid_before=now - datetime.timedelta(minutes=5))
    valid["not_valid_after"] = now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder(**valid)
        .subject_name(_name(f"{label} CA"))
        .issuer_name(_name(f"{label} CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    usage = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    cert = (
        x509.CertificateBuilder(**valid)
        .subject_name(_name(f"{label} service"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {"ca": folder / f"{label}-ca.pem", "cert": folder / f"{label}.pem"}
    paths["key"] = folder / f"{label}-key.pem"
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(_pem_key(key))
    return {k: str(v) for k, v in paths.items()}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    return make_pki(folder, "stack"), make_pki(folder, "stranger")


@pytest.fixture(scope="module")
def stack(pki):
    ours, _ = pki
    with running_stack(tls_cert=ours["cert"], tls_key=ours["key"], tls_ca=ours["ca"]) as s:
        yield s


def test_a_client_that_trusts_the_ca_is_served_over_tls(stack, pki, prompt_ids):
    params = GenerateParams(max_tokens=6, ignore_eos=True)
    with CoordinatorClient(stack.address, tls_ca=pki[0]["ca"]) as client:
        assert len(client.generate(prompt_ids[0], params).token_ids) == 6
    with CoordinatorClient(stack.address) as plaintext, pytest.raises(grpc.RpcError) as err:
        plaintext.generate(prompt_ids[0], params, timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def _target_info(stack, ca: str, cert: str = "", key: str = "") -> common_pb2.ModelInfo:
    read = lambda path: Path(path).read_bytes() if path else None  # noqa: E731
    credentials = grpc.ssl_channel_credentials(read(ca), read(key), read(cert))
    with grpc.secure_channel(stack.target_address, credentials) as channel:
        stub = target_pb2_grpc.TargetServiceStub(channel)
        request = common_pb2.InfoRequest()
        return stub.GetInfo(request, timeout=10, metadata=stack.internal_metadata)


def test_the_model_services_let_in_only_clients_with_a_certificate_from_the_ca(stack, pki):
    ours, stranger = pki
    assert _target_info(stack, ours["ca"], ours["cert"], ours["key"]).vocab_size > 0
    for cert, key in (("", ""), (stranger["cert"], stranger["key"])):
        with pytest.raises(grpc.RpcError) as err:
            _target_info(stack, ours["ca"], cert, key)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
