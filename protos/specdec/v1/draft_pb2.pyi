from specdec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IngestPlan(_message.Message):
    __slots__ = ("request_id", "start_position", "token_ids", "eager", "features")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    EAGER_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    start_position: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    eager: bool
    features: bytes
    def __init__(self, request_id: _Optional[str] = ..., start_position: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., eager: bool = ..., features: _Optional[bytes] = ...) -> None: ...

class ProposeEntry(_message.Message):
    __slots__ = ("request_id", "num_tokens", "sampling", "ahead_of", "min_prob", "prompt_lookup_min", "prompt_lookup_max", "num_branches", "branch_budget_s")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    AHEAD_OF_FIELD_NUMBER: _ClassVar[int]
    MIN_PROB_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOOKUP_MIN_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOOKUP_MAX_FIELD_NUMBER: _ClassVar[int]
    NUM_BRANCHES_FIELD_NUMBER: _ClassVar[int]
    BRANCH_BUDGET_S_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_tokens: int
    sampling: _common_pb2.SamplingParams
    ahead_of: _containers.RepeatedScalarFieldContainer[int]
    min_prob: float
    prompt_lookup_min: int
    prompt_lookup_max: int
    num_branches: int
    branch_budget_s: float
    def __init__(self, request_id: _Optional[str] = ..., num_tokens: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., ahead_of: _Optional[_Iterable[int]] = ..., min_prob: _Optional[float] = ..., prompt_lookup_min: _Optional[int] = ..., prompt_lookup_max: _Optional[int] = ..., num_branches: _Optional[int] = ..., branch_budget_s: _Optional[float] = ...) -> None: ...

class DraftStepRequest(_message.Message):
    __slots__ = ("step_id", "kv_scales_version", "kv_scales", "ingest", "propose", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    KV_SCALES_VERSION_FIELD_NUMBER: _ClassVar[int]
    KV_SCALES_FIELD_NUMBER: _ClassVar[int]
    INGEST_FIELD_NUMBER: _ClassVar[int]
    PROPOSE_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    kv_scales_version: int
    kv_scales: _common_pb2.KVScaleTable
    ingest: _containers.RepeatedCompositeFieldContainer[IngestPlan]
    propose: _containers.RepeatedCompositeFieldContainer[ProposeEntry]
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, step_id: _Optional[int] = ..., kv_scales_version: _Optional[int] = ..., kv_scales: _Optional[_Union[_common_pb2.KVScaleTable, _Mapping]] = ..., ingest: _Optional[_Iterable[_Union[IngestPlan, _Mapping]]] = ..., propose: _Optional[_Iterable[_Union[ProposeEntry, _Mapping]]] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Proposal(_message.Message):
    __slots__ = ("request_id", "token_ids", "draft_probs", "guessed_token_id", "looked_up", "ahead_accepted")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PROBS_FIELD_NUMBER: _ClassVar[int]
    GUESSED_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOOKED_UP_FIELD_NUMBER: _ClassVar[int]
    AHEAD_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    draft_probs: _containers.RepeatedCompositeFieldContainer[_common_pb2.SparseProbs]
    guessed_token_id: int
    looked_up: bool
    ahead_accepted: int
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., draft_probs: _Optional[_Iterable[_Union[_common_pb2.SparseProbs, _Mapping]]] = ..., guessed_token_id: _Optional[int] = ..., looked_up: bool = ..., ahead_accepted: _Optional[int] = ...) -> None: ...

class RequestError(_message.Message):
    __slots__ = ("request_id", "code", "message")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    code: str
    message: str
    def __init__(self, request_id: _Optional[str] = ..., code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class DraftStepResponse(_message.Message):
    __slots__ = ("proposals", "cached", "failed", "num_free_pages")
    PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    proposals: _containers.RepeatedCompositeFieldContainer[Proposal]
    cached: _containers.RepeatedCompositeFieldContainer[_common_pb2.CachedLength]
    failed: _containers.RepeatedCompositeFieldContainer[RequestError]
    num_free_pages: int
    def __init__(self, proposals: _Optional[_Iterable[_Union[Proposal, _Mapping]]] = ..., cached: _Optional[_Iterable[_Union[_common_pb2.CachedLength, _Mapping]]] = ..., failed: _Optional[_Iterable[_Union[RequestError, _Mapping]]] = ..., num_free_pages: _Optional[int] = ...) -> None: ...

class DraftStepReply(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: DraftStepResponse
    error: _common_pb2.StepError
    def __init__(self, response: _Optional[_Union[DraftStepResponse, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.StepError, _Mapping]] = ...) -> None: ...
