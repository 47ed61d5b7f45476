"""A scripted OpenAI-compatible chat server on 127.0.0.1, for testing the LLM path through real litellm.

Tests queue replies (a status code and a JSON body, optionally after a delay) and read back every request
body the server received, so they can assert what a prompt held and how many requests were sent::

    with ScriptedLLMServer() as server:
        server.script(rate_limited(), chat("```c ... ```"))
        ...  # model "openai/test-model", api_base=server.api_base, api_key="sk-test"
        assert len(server.requests) == 2

A request with nothing left in the queue gets a 500 naming the problem, so a test that sends more requests
than it scripted fails loudly instead of hanging.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")


@dataclass
class ScriptedReply:
    """One reply the server will send."""

    status: int = 200
    body: dict[str, Any] = field(default_factory=dict)
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


def chat(
    content: str, prompt_tokens: int = 120, completion_tokens: int = 80, model: str = "test-model"
) -> ScriptedReply:
    """A successful chat completion whose message is ``content``, with the given usage."""
    return ScriptedReply(
        body={
            "id": "chatcmpl-scripted",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )


def error(
    status: int, message: str, kind: str = "server_error", headers: dict[str, str] | None = None
) -> ScriptedReply:
    """An error reply shaped like OpenAI's."""
    return ScriptedReply(
        status=status, body={"error": {"message": message, "type": kind, "code": kind}}, headers=headers or {}
    )


def rate_limited(retry_after_s: float | None = None) -> ScriptedReply:
    """A 429, optionally with a Retry-After header."""
    headers = {"retry-after": str(retry_after_s)} if retry_after_s is not None else {}
    return error(429, "Rate limit reached for test-model", "rate_limit_exceeded", headers)


def slow(reply: ScriptedReply, delay_s: float) -> ScriptedReply:
    """The same reply, sent only after ``delay_s`` seconds (to make a client time out)."""
    reply.delay_s = delay_s
    return reply


class ScriptedLLMServer:
    """A threaded HTTP server on a free loopback port that answers chat requests from a queue."""

    def __init__(self) -> None:
        self._replies: deque[ScriptedReply] = deque()
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        """Every chat request body received, in order."""
        self.paths: list[str] = []
        """The path of every request received (chat or not)."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        # A short poll interval: shutdown() waits up to one interval, and tests start many servers.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="scripted-llm", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def api_base(self) -> str:
        """The base URL litellm's `openai/` provider takes (`…/v1`)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *replies: ScriptedReply) -> None:
        """Queue replies, sent in order, one per request."""
        with self._lock:
            self._replies.extend(replies)

    @property
    def pending(self) -> int:
        """Scripted replies not sent yet."""
        with self._lock:
            return len(self._replies)

    def prompts(self) -> list[str]:
        """The whole text (all messages joined) of every request received, in order."""
        return ["\n".join(str(m.get("content", "")) for m in body.get("messages", [])) for body in self.requests]

    def __enter__(self) -> ScriptedLLMServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _next(self, path: str, body: dict[str, Any]) -> ScriptedReply:
        with self._lock:
            self.paths.append(path)
            if path.rstrip("/") not in CHAT_PATHS:
                return error(404, f"scripted server serves only {CHAT_PATHS}, not {path}", "not_found")
            self.requests.append(body)
            if not self._replies:
                return error(500, "the test scripted no reply for this request", "unscripted_request")
            return self._replies.popleft()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"unparsed": raw.decode(errors="replace")}
                reply = server._next(self.path.split("?")[0], body)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                payload = json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test): nothing to answer

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        return Handler
