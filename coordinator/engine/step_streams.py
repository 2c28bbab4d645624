"""The per-step RPCs over long-lived streams (``DraftService.StepStream``,
``TargetService.VerifyStream``), behind the unary call shape the engine uses.

A message on an open gRPC stream costs about half a unary call (no call setup, metadata
or status per message: 0.29-0.36 against 0.58-0.78 ms a round trip between two processes
on the 2-core development machine), and a step makes one or two of them. The engine
still calls ``stub.Step(message, timeout=, metadata=)``; here that writes the message on
the stream and reads its reply.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc


class StepRefused(grpc.RpcError):
    """A step the service refused in its reply, as a unary call's status would have."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self._code = grpc.StatusCode[code] if code in grpc.StatusCode.__members__ else None
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code or grpc.StatusCode.UNKNOWN

    def details(self) -> str:
        return self._details


class StreamedCall:
    """``await call(message, timeout=, metadata=)`` -> the reply's response, over one stream
    opened by ``open_stream`` (a stub's stream-stream method) on first use, with the
    caller's fixed ``metadata`` (its identity and token). The per-call ``metadata`` (the
    step's trace context) travels in the message's ``trace_context``. ``timeout`` is the
    caller's to enforce, as for any stub (``Engine._call`` bounds every call); a call that
    fails or is cancelled by it closes the stream and the next opens a new one, so a late
    reply is never read as another step's. Calls take turns."""

    def __init__(
        self,
        open_stream: Callable[..., grpc.aio.StreamStreamCall],
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._open = open_stream
        self._metadata = metadata
        self._stream: grpc.aio.StreamStreamCall | None = None
        self._turn = asyncio.Lock()

    async def __call__(
        self, message: Any, timeout: float, metadata: tuple[tuple[str, str], ...] = ()
    ) -> Any:
        message.trace_context.update(dict(metadata))
        async with self._turn:
            if self._stream is not None and self._stream.done():
                # The service went away with no call in flight (a write would raise the
                # stream's InvalidStateError): fail as a broken call would, and reopen next.
                self.close()
                raise StepRefused("UNAVAILABLE", "the stream to the service ended between steps")
            try:
                if self._stream is None:
                    self._stream = self._open(metadata=self._metadata)
                await self._stream.write(message)
                reply = await self._stream.read()
            except BaseException:
                self.close()
                raise
            if reply is grpc.aio.EOF:
                self.close()
                raise StepRefused("UNAVAILABLE", "the service ended the stream")
        if reply.HasField("error"):
            raise StepRefused(reply.error.code, reply.error.message)
        return reply.response

    def close(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None


class StreamedStub:
    """A model service's stub whose ``name`` RPC runs over its stream RPC ``stream_name``
    (``StreamedCall``); every other RPC is the stub's own."""

    def __init__(
        self, stub: Any, name: str, stream_name: str, metadata: tuple[tuple[str, str], ...]
    ) -> None:
        self._stub = stub
        setattr(self, name, StreamedCall(getattr(stub, stream_name), metadata))

    def __getattr__(self, attr: str) -> Any:  # only for what __init__ did not set
        return getattr(self._stub, attr)
