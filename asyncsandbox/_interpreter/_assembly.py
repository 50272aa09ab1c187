"""One call's :class:`Execution`, assembled as its events arrive, in bounded memory."""

from __future__ import annotations

import base64
import binascii
import codecs
import time
from collections import deque
from typing import Any

import msgspec

from ._models import (
    BINARY_FIELDS,
    MIME_FIELDS,
    Execution,
    ExecutionError,
    Logs,
    OutputMessage,
    Result,
)

_decode_json = msgspec.json.Decoder()


class _Chunks:
    """The chunks of one stream: the first and the last, up to half of ``limit``
    characters each; what falls between them is dropped (``truncated``)."""

    __slots__ = ("head", "head_limit", "head_size", "tail", "tail_limit", "tail_size", "truncated")

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head: list[str] = []
        self.head_size = 0
        self.tail: deque[str] = deque()
        self.tail_size = 0
        self.truncated = False

    def add(self, text: str) -> None:
        room = self.head_limit - self.head_size
        if room > 0 and not self.tail:
            part, text = text[:room], text[room:]
            self.head.append(part)
            self.head_size += len(part)
            if not text:
                return
        self.tail.append(text)
        self.tail_size += len(text)
        while self.tail_size > self.tail_limit:
            excess = self.tail_size - self.tail_limit
            first = self.tail[0]
            if len(first) <= excess:
                self.tail.popleft()
                self.tail_size -= len(first)
            else:
                self.tail[0] = first[excess:]
                self.tail_size -= excess
            self.truncated = True

    def chunks(self) -> list[str]:
        return [*self.head, *self.tail]


class Assembly:
    """Turns a call's frames into events and, at its end, its :class:`Execution`."""

    def __init__(self, *, context_id: str, limit: int, restarted: bool) -> None:
        self.context_id = context_id
        self.limit = limit
        self.started = time.monotonic()
        self._streams = {"stdout": _Chunks(limit), "stderr": _Chunks(limit)}
        self._decoders = {
            name: codecs.getincrementaldecoder("utf-8")("replace") for name in self._streams
        }
        self._results: list[Result] = []
        self._result_bytes = 0
        self._results_dropped = False
        self.error: ExecutionError | None = None
        self.count: int | None = None
        self.restarted = restarted
        self.timed_out = False

    def output(self, stream: str, data: bytes) -> OutputMessage | None:
        text = self._decoders[stream].decode(data)
        if not text:
            return None  # the start of a character split across chunks
        self._streams[stream].add(text)
        return OutputMessage(line=text, timestamp=time.time_ns(), error=stream == "stderr")

    def result(self, payload: bytes, dropped: int | None) -> Result | None:
        """A displayed object; ``None`` (and the execution ``truncated``) once the results
        together are over the limit, or when the runner dropped one for its size."""
        if dropped or self._result_bytes + len(payload) > self.limit:
            self._results_dropped = True
            return None
        result = _result(payload)
        if result is None:
            return None
        self._result_bytes += len(payload)
        self._results.append(result)
        return result

    def raised(self, payload: bytes) -> ExecutionError | None:
        try:
            error = msgspec.json.decode(payload, type=ExecutionError)
        except msgspec.DecodeError:
            return None
        self.error = error
        return error

    def fault(self, name: str, value: str) -> ExecutionError:
        """The call's interpreter died or was restarted: that is its error (unless the code
        raised one first), and the context's state is gone."""
        self.restarted = True
        error = ExecutionError(name=name, value=value)
        if self.error is None:
            self.error = error
        return error

    def done(self, header: dict[str, Any]) -> ExecutionError | None:
        """The runner's ``done`` frame; the fault it reports, if any."""
        count = header.get("count")
        self.count = count if isinstance(count, int) else None
        if header.get("restarted"):
            self.restarted = True
        fault = header.get("fault")
        if isinstance(fault, dict):
            return self.fault(
                str(fault.get("name", "InterpreterDied")), str(fault.get("value", ""))
            )
        return None

    def execution(self) -> Execution:
        for name, decoder in self._decoders.items():
            rest = decoder.decode(b"", final=True)
            if rest:
                self._streams[name].add(rest)
        out, err = self._streams["stdout"], self._streams["stderr"]
        return Execution(
            results=self._results,
            logs=Logs(
                stdout=out.chunks(),
                stderr=err.chunks(),
                stdout_truncated=out.truncated,
                stderr_truncated=err.truncated,
            ),
            error=self.error,
            execution_count=self.count,
            context_id=self.context_id,
            duration=time.monotonic() - self.started,
            timed_out=self.timed_out,
            restarted=self.restarted,
            truncated=out.truncated or err.truncated or self._results_dropped,
        )


def _result(payload: bytes) -> Result | None:
    """A result from the kernel's display bundle (``{"data": {mime: value}, "main"}``); the
    kernel runs the user's code, so nothing it sends is trusted to be well formed: what
    does not fit is left out, never raised."""
    try:
        message = _decode_json.decode(payload)
    except msgspec.DecodeError:
        return None
    if not isinstance(message, dict) or not isinstance(message.get("data"), dict):
        return None
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for mime, value in message["data"].items():
        name = MIME_FIELDS.get(mime)
        if name is None:
            extra[str(mime)] = value
        elif name in BINARY_FIELDS:
            if isinstance(value, str):
                try:
                    fields[name] = base64.b64decode(value)
                except (binascii.Error, ValueError):
                    continue
        elif name == "json" or isinstance(value, str):
            fields[name] = value
    return Result(**fields, extra=extra, is_main_result=message.get("main") is True)
