"""Build and run the target gRPC server."""

from __future__ import annotations

from specdec.model_service.service import ModelService
from specdec.target_service.servicer import TargetServicer
from specdec.target_service.verifier import Verifier
from specdec.v1 import target_pb2
from specdec.v1.target_pb2_grpc import add_TargetServiceServicer_to_server

SERVICE_NAME = target_pb2.DESCRIPTOR.services_by_name["TargetService"].full_name
SERVICE = ModelService(
    "target", SERVICE_NAME, TargetServicer, Verifier, add_TargetServiceServicer_to_server
)
create_server = SERVICE.create_server
main = SERVICE.main
