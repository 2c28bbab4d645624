from specdec.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EndBurstRequest(_message.Message):
    __slots__ = ("step_id",)
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    def __init__(self, step_id: _Optional[int] = ...) -> None: ...

class EndBurstResponse(_message.Message):
    __slots__ = ("ended",)
    ENDED_FIELD_NUMBER: _ClassVar[int]
    ended: bool
    def __init__(self, ended: bool = ...) -> None: ...

class PrefillChunk(_message.Message):
    __slots__ = ("request_id", "start_position", "token_ids", "is_last", "sampling", "resumes")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IS_LAST_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RESUMES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    start_position: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    is_last: bool
    sampling: _common_pb2.SamplingParams
    resumes: bool
    def __init__(self, request_id: _Optional[str] = ..., start_position: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., is_last: bool = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., resumes: bool = ...) -> None: ...

class VerifyEntry(_message.Message):
    __slots__ = ("request_id", "start_position", "last_token_id", "proposal_ids", "draft_probs", "sampling", "max_new_tokens", "stop_token_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    START_POSITION_FIELD_NUMBER: _ClassVar[int]
    LAST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PROPOSAL_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PROBS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    start_position: int
    last_token_id: int
    proposal_ids: _containers.RepeatedScalarFieldContainer[int]
    draft_probs: _containers.RepeatedCompositeFieldContainer[_common_pb2.SparseProbs]
    sampling: _common_pb2.SamplingParams
    max_new_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., start_position: _Optional[int] = ..., last_token_id: _Optional[int] = ..., proposal_ids: _Optional[_Iterable[int]] = ..., draft_probs: _Optional[_Iterable[_Union[_common_pb2.SparseProbs, _Mapping]]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., max_new_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("step_id", "prefill", "decode", "num_steps", "trace_context", "return_features", "num_threads")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    RETURN_FEATURES_FIELD_NUMBER: _ClassVar[int]
    NUM_THREADS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    prefill: _containers.RepeatedCompositeFieldContainer[PrefillChunk]
    decode: _containers.RepeatedCompositeFieldContainer[VerifyEntry]
    num_steps: int
    trace_context: _containers.ScalarMap[str, str]
    return_features: bool
    num_threads: int
    def __init__(self, step_id: _Optional[int] = ..., prefill: _Optional[_Iterable[_Union[PrefillChunk, _Mapping]]] = ..., decode: _Optional[_Iterable[_Union[VerifyEntry, _Mapping]]] = ..., num_steps: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., return_features: bool = ..., num_threads: _Optional[int] = ...) -> None: ...

class VerifyResult(_message.Message):
    __slots__ = ("request_id", "token_ids", "num_accepted", "num_cached_tokens", "error_code", "error_message", "num_prefix_cached_tokens", "features", "feature_start", "logprobs", "prompt_logprobs", "prompt_logprobs_start")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NUM_PREFIX_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    FEATURE_START_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_START_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_accepted: int
    num_cached_tokens: int
    error_code: str
    error_message: str
    num_prefix_cached_tokens: int
    features: bytes
    feature_start: int
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprobs]
    prompt_logprobs_start: int
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., num_accepted: _Optional[int] = ..., num_cached_tokens: _Optional[int] = ..., error_code: _Optional[str] = ..., error_message: _Optional[str] = ..., num_prefix_cached_tokens: _Optional[int] = ..., features: _Optional[bytes] = ..., feature_start: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprobs, _Mapping]]] = ..., prompt_logprobs_start: _Optional[int] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("results", "num_free_pages")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    NUM_FREE_PAGES_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[VerifyResult]
    num_free_pages: int
    def __init__(self, results: _Optional[_Iterable[_Union[VerifyResult, _Mapping]]] = ..., num_free_pages: _Optional[int] = ...) -> None: ...

class VerifyReply(_message.Message):
    __slots__ = ("response", "error")
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    response: VerifyResponse
    error: _common_pb2.StepError
    def __init__(self, response: _Optional[_Union[VerifyResponse, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.StepError, _Mapping]] = ...) -> None: ...
