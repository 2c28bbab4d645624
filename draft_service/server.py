"""Build and run the draft gRPC server."""

from __future__ import annotations

from specdec.draft_service.drafter import Drafter
from specdec.draft_service.servicer import DraftServicer
from specdec.model_service.service import ModelService
from specdec.v1 import draft_pb2
from specdec.v1.draft_pb2_grpc import add_DraftServiceServicer_to_server

SERVICE_NAME = draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name
SERVICE = ModelService(
    "draft", SERVICE_NAME, DraftServicer, Drafter, add_DraftServiceServicer_to_server
)
create_server = SERVICE.create_server
main = SERVICE.main
