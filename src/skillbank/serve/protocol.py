"""The HTTP/1.1 connection deadlines uvicorn lacks, and JSON errors from its request parser.

uvicorn (0.55 here; its httptools protocol alike) arms a timer only once a response is complete (keep-alive).
A connection that has sent nothing, part of a request head, or a head and then a body one byte at a time,
waits forever, and enough of them exhaust the server's sockets (slowloris, slow POST). :func:`http_protocol`
returns uvicorn's h11 protocol with two deadlines on each request:

- the head (request line and headers) must arrive whole within ``header_timeout_s`` of the connection
  opening, or of the first byte of a later head on a kept-alive connection; further bytes do not extend it;
- the body must arrive within ``body_timeout_s`` of the head, extended by one second per ``body_min_rate``
  bytes received (Apache mod_reqtimeout's ``body=...,MinRate=...``): a large upload at a steady pace is
  never cut, a trickle is, whatever Content-Length it announced. ``body_min_rate`` 0: a fixed total.

A late head or body is answered 408 in the service's JSON error shape when no answer has started, and the
connection is closed; an empty connection is closed as an idle keep-alive one is. A request the parser
refuses (no Host header, two of them, a malformed line) gets uvicorn's 400 in the same JSON shape instead of
its plain text.
"""
from __future__ import annotations

import asyncio
import json


def error_body(message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None}}).encode()


def http_protocol(header_timeout_s: float, body_timeout_s: float | None = None, body_min_rate: float = 0.0):
    """uvicorn's h11 protocol class with the deadlines above (``body_timeout_s`` None: no body deadline).

    A class made per setting, because uvicorn builds one protocol object per connection from the class alone.
    """
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class DeadlineH11Protocol(H11Protocol):
        _head_deadline: asyncio.TimerHandle | None = None
        _body_deadline: asyncio.TimerHandle | None = None
        _body_started = 0.0
        _body_bytes = 0
        _parse_error = ""

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_head_deadline()
            # h11 says why it refused a request (RemoteProtocolError); uvicorn drops the reason, so keep it
            # for the 400 (uvicorn makes one h11.Connection per connection, in __init__).
            next_event = self.conn.next_event

            def keeping_the_reason():
                try:
                    return next_event()
                except h11.RemoteProtocolError as exc:
                    self._parse_error = str(exc)
                    raise
            self.conn.next_event = keeping_the_reason

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                return
            state = self.conn.their_state
            if state is h11.IDLE:  # still waiting for (the rest of) a head
                if self._head_deadline is None:  # first bytes of a head on a kept-alive connection
                    self._arm_head_deadline()
            else:
                self._disarm_head_deadline()
            if state is h11.SEND_BODY and body_timeout_s is not None:
                self._track_body(len(data))
            else:
                self._disarm_body_deadline()

        def connection_lost(self, exc) -> None:
            self._disarm_head_deadline()
            self._disarm_body_deadline()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            reason = f": {self._parse_error}" if self._parse_error else ""
            self._answer_and_close(400, error_body(f"invalid HTTP request{reason}", "invalid_request_error"))

        # -- the head ------------------------------------------------------------------------------
        def _arm_head_deadline(self) -> None:
            self._head_deadline = self.loop.call_later(header_timeout_s, self._head_timed_out)

        def _disarm_head_deadline(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        def _head_timed_out(self) -> None:
            self._head_deadline = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.conn.trailing_data[0]:  # part of a head: say why (h11 cannot: no request to answer yet)
                body = error_body(f"the request head did not arrive within {header_timeout_s:g} s", "timeout")
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                                     b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                self.logger.warning("closed a connection from %s: its request head did not arrive within %g s",
                                    self._peer(), header_timeout_s)
            self.transport.close()

        # -- the body ------------------------------------------------------------------------------
        def _track_body(self, n: int) -> None:
            if self._body_deadline is None:  # the head just completed (the bytes counted may include its end)
                self._body_started, self._body_bytes = self.loop.time(), 0
            else:
                self._body_deadline.cancel()
            self._body_bytes += n
            allowed = body_timeout_s + (self._body_bytes / body_min_rate if body_min_rate > 0 else 0.0)
            self._body_deadline = self.loop.call_at(self._body_started + allowed, self._body_timed_out)

        def _disarm_body_deadline(self) -> None:
            if self._body_deadline is not None:
                self._body_deadline.cancel()
                self._body_deadline = None

        def _body_timed_out(self) -> None:
            self._body_deadline = None
            if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
                return
            rate = f" (plus 1 s per {body_min_rate:g} bytes received)" if body_min_rate > 0 else ""
            self.logger.warning("closed a connection from %s: its request body did not arrive within %g s%s",
                                self._peer(), body_timeout_s, rate)
            if self.cycle is not None and not self.cycle.response_started:
                # The app may be waiting for the rest of the body: it now reads a disconnect, and whatever it
                # answers is dropped - this 408 is the answer.
                self.cycle.disconnected = True
                self.cycle.message_event.set()
                self._answer_and_close(408, error_body(
                    f"the request body did not arrive within {body_timeout_s:g} s{rate}", "timeout"))
            else:  # an answer is (partly) out already: nothing can follow it
                self.transport.close()

        def _answer_and_close(self, status: int, body: bytes) -> None:
            try:
                headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                           (b"content-length", b"%d" % len(body))]
                for event in (h11.Response(status_code=status, headers=headers), h11.Data(data=body),
                              h11.EndOfMessage()):
                    self.transport.write(self.conn.send(event))
            except h11.LocalProtocolError:  # h11 is past the point of answering (its state says so): just close
                pass
            self.transport.close()

        def _peer(self) -> str:
            return "%s:%d" % self.client if self.client else "?"

    return DeadlineH11Protocol
