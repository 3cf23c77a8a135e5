"""The OpenAI-compatible routes, as a Starlette app over an `Engine` that runs on its own thread.

Handlers never touch the model: they submit requests to the engine and read their tokens from an asyncio queue
that the engine thread feeds. A client that disconnects cancels its requests, and the engine frees their lanes
at its next round.
"""
import asyncio
import contextlib
import dataclasses
import hashlib
import hmac
import json
import logging
import time
import uuid

import numpy as np
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from tensorfold.errors import TensorfoldError
from tensorfold.request import FINISHED
from tensorfold.serve import protocol
from tensorfold.serve.metrics import Metrics
from tensorfold.serve.output import ChatOutput, TextOutput
from tensorfold.serve.protocol import APIError, read_generation, read_ids, read_messages, read_prompt
from tensorfold.serve.structured import read_grammar
from tensorfold.serve.tokens import TokenBytes, encode

MAX_BODY_BYTES = 4 << 20
DISCONNECT_CHECK = 0.05  # seconds between checks that a client is still there: a lane is freed within this
KEEPALIVE = 15.0  # seconds of silence on a stream (a long prompt) before a keep-alive comment
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no cache or proxy holds the events back
log = logging.getLogger("tensorfold.serve")


def token_sha256(ids) -> str:
    """sha256 hex of token ids as little-endian int32: the identity of an output across runs and servers."""
    return hashlib.sha256(np.asarray(ids, "<i4").tobytes()).hexdigest()


def feeder(loop, events, index: int):
    """An engine listener that puts (index, item) on `events`, an asyncio queue, from the engine thread."""
    return lambda item: loop.call_soon_threadsafe(events.put_nowait, (index, item))


class Choice:
    """One choice of a request: its engine request, its text output and its queue of engine events."""

    def __init__(self, index, request, text):
        self.index, self.request, self.text = index, request, text
        self.chat: ChatOutput | None = None
        self.echo: str | None = None  # (completions) the prompt's text, sent before the output
        self.tokens_seen = 0  # tokens handled so far (their logprobs are request.logprobs[:tokens_seen])
        self.logprobs_sent = 0
        self.stopped_at: int | None = None  # tokens up to the one that completed a stop string

    def push(self, token: int) -> str:
        """Take one token into the text; on a stop string, note where and cancel the rest of the request."""
        self.tokens_seen += 1
        delta = self.text.push(token)
        if self.text.stopped and self.stopped_at is None:
            self.stopped_at = self.tokens_seen
            self.request.cancel()  # tokens the engine makes before it sees this are dropped
        return delta

    @property
    def output(self) -> list:
        """The choice's token ids: up to a stop string, if one ended it."""
        return self.request.output[:self.stopped_at]

    @property
    def finish_reason(self) -> str:
        if self.text.stopped or self.request.finish_reason == "stop":
            return "stop"
        return {"length": "length", "cancelled": "stop"}.get(self.request.finish_reason, "stop")


class Server:
    """The routes and their shared state: engine, model, names, limits and metrics."""

    def __init__(self, engine, served_model_name: str, api_key: str | None = None, max_queue: int = 64,
                 allowed_origins=(), keepalive: float = KEEPALIVE):
        if api_key is not None and not api_key:
            raise TensorfoldError("the API key is empty: give a key, or none to serve without one")
        self.engine, self.model = engine, engine.model
        self.name, self.api_key, self.max_queue = served_model_name, api_key, max_queue
        self.allowed_origins, self.keepalive = list(allowed_origins), keepalive
        self.metrics = Metrics()
        self.token_bytes = TokenBytes(self.model.tokenizer)
        self.ready, self.draining = False, False
        self.open_requests = 0  # generation requests whose answer has not been sent in full
        self.created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        """Start the engine thread with the app; on shutdown (SIGTERM included) stop taking requests, let uvicorn
        finish the open ones, then cancel what is left and stop the engine."""
        self.engine.start()
        self.ready = True
        try:
            yield
        finally:
            self.draining = True
            self.engine.stop(cancel=True)

    def app(self) -> Starlette:
        routes = [Route("/health", self.health), Route("/metrics", self.prometheus),
                  Route("/v1/models", self.models), Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                  Route("/tokenize", self.tokenize, methods=["POST"]),
                  Route("/detokenize", self.detokenize, methods=["POST"])]
        middleware = [Middleware(CORSMiddleware, allow_origins=self.allowed_origins, allow_methods=["GET", "POST"],
                                 allow_headers=["authorization", "content-type"])] if self.allowed_origins else []
        return Starlette(routes=routes, lifespan=self.lifespan, middleware=middleware,
                         exception_handlers={APIError: self.api_error, 404: self.not_found, 405: self.not_allowed})

    # --- plumbing ------------------------------------------------------------------------------------------------

    async def api_error(self, request, error: APIError):
        self.metrics.add("request_errors_total")
        headers = {"Retry-After": "1"} if error.status == 429 else None
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    async def not_found(self, request, exc):
        return JSONResponse(APIError(404, f"no route {request.url.path}").body(), status_code=404)

    async def not_allowed(self, request, exc):
        return JSONResponse(APIError(405, f"{request.method} is not allowed on {request.url.path}").body(),
                            status_code=405)

    async def body(self, request: Request) -> dict:
        """The JSON object of a POST, after the auth, state, media type and size checks."""
        self.check_auth(request)
        self.check_serving()
        media, _, options = request.headers.get("content-type", "").partition(";")
        charset = options.strip().lower().removeprefix("charset=").strip('"') if "charset" in options else "utf-8"
        if media.strip().lower() != "application/json" or charset not in ("utf-8", "utf8"):
            raise APIError(415, "send the body as JSON in UTF-8, with 'Content-Type: application/json'")
        try:
            declared = int(request.headers.get("content-length") or 0)
        except ValueError:
            raise APIError(400, "the Content-Length header is not a number") from None
        if declared > MAX_BODY_BYTES:
            raise APIError(413, f"request body larger than {MAX_BODY_BYTES} bytes")
        raw = bytearray()
        try:
            async for part in request.stream():  # counted as it arrives: a chunked body is refused once too long
                raw += part
                if len(raw) > MAX_BODY_BYTES:
                    raise APIError(413, f"request body larger than {MAX_BODY_BYTES} bytes")
        except ClientDisconnect:  # hung up, or sent a body the HTTP parser refused: nobody reads this answer
            raise APIError(400, "the connection closed before the body was complete") from None
        body = await asyncio.to_thread(protocol.parse_body, bytes(raw))  # a 4 MiB body takes a while to check
        model = body.get("model")
        if model is not None and model != self.name:
            raise APIError(404, f"The model `{model}` does not exist.", "model")
        return body

    def check_serving(self) -> None:
        if self.draining:
            raise APIError(503, "the server is shutting down")
        if self.engine.failure is not None:
            raise APIError(503, f"the engine has stopped: {self.engine.failure!r}")

    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "").encode("latin-1")  # the bytes sent
        if not hmac.compare_digest(given, f"Bearer {self.api_key}".encode()):
            raise APIError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'")

    # --- simple routes ---------------------------------------------------------------------------------------------

    async def health(self, request):
        if not self.ready or self.draining or self.engine.failure is not None:
            state = "loading" if not self.ready else "draining" if self.draining else "the engine has stopped"
            return JSONResponse(APIError(503, state).body(), status_code=503)
        return JSONResponse({"status": "ok"})

    async def prometheus(self, request):
        return PlainTextResponse(self.metrics.render(self.engine), media_type="text/plain; version=0.0.4")

    async def models(self, request):
        self.check_auth(request)
        return JSONResponse({"object": "list", "data": [{
            "id": self.name, "object": "model", "created": self.created, "owned_by": "tensorfold",
            "root": self.name, "max_model_len": self.engine.context}]})

    async def tokenize(self, request):
        body = await self.body(request)
        if "messages" in body:
            ids = (await asyncio.to_thread(self.render_chat, body))[0]
        else:
            ids = await asyncio.to_thread(self.prompt_ids, body)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": self.engine.context})

    async def detokenize(self, request):
        body = await self.body(request)
        tokens = body.get("tokens")
        if not (isinstance(tokens, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in tokens)):
            raise APIError(400, "tokens must be a list of token ids", "tokens")
        tokens = await asyncio.to_thread(read_ids, tokens, self.model.config.vocab_size, "tokens")
        return JSONResponse({"prompt": await asyncio.to_thread(self.model.tokenizer.decode, tokens)})

    # --- generation ------------------------------------------------------------------------------------------------

    def prompt_ids(self, body) -> list:
        prompt = read_prompt(body, self.model.config.vocab_size)
        return encode(self.model.tokenizer, prompt) if isinstance(prompt, str) else prompt

    def render_chat(self, body) -> tuple:
        """(prompt ids, whether the prompt opened a think block) for a chat request."""
        messages, kwargs = read_messages(body), protocol.read_template_kwargs(body)
        add_generation_prompt, continue_final_message = protocol.read_template_flags(body)
        tools = body.get("tools")
        if tools is not None and not (isinstance(tools, list) and tools and all(isinstance(t, dict) for t in tools)):
            raise APIError(400, "tools must be a non-empty list of tool objects", "tools")
        try:
            text = self.model.tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tools=tools,
                continue_final_message=continue_final_message, **kwargs)
        except ValueError as e:  # the final message cannot be continued
            raise APIError(400, str(e), "continue_final_message") from None
        except Exception as e:  # noqa: BLE001 (the template compiled at load: what fails now is these messages)
            message = getattr(e, "message", None) or str(e)
            raise APIError(400, f"the chat template refused these messages: {message}", "messages") from None
        return encode(self.model.tokenizer, text), text.rstrip().endswith("<think>")

    def submit(self, ids, generation, events, loop) -> list:
        """Submit one engine request per choice; engine events arrive on `events` as (choice index, item)."""
        self.check_serving()  # again: a drain may have begun while the prompt was being tokenized
        if generation.n > self.max_queue:
            raise APIError(400, f"n ({generation.n}) is more than the queue holds ({self.max_queue})", "n")
        if self.engine.queue_depth + generation.n > self.max_queue:
            raise APIError(429, f"the queue is full ({self.max_queue} requests waiting); retry shortly")
        choices = []
        try:
            for index in range(generation.n):
                params = generation.params
                if params.seed is not None and index:  # the draws read a seed modulo 2^64
                    params = dataclasses.replace(params, seed=(params.seed + index) % 2**64)
                request = self.engine.submit(ids, params, listener=feeder(loop, events, index))
                choices.append(Choice(index, request, TextOutput(self.model.tokenizer, generation.stop)))
        except TensorfoldError as e:
            for choice in choices:
                choice.request.cancel()
            raise APIError(400, str(e), "messages" if "context length" in str(e) else None) from None
        self.metrics.add("prompt_tokens_total", len(ids) * len(choices))
        return choices

    async def events(self, choices, events, http_request, keepalive: float | None = None):
        """Yield (choice, token or FINISHED) until every choice has finished, and (None, None) after each
        `keepalive` seconds without an event; cancel all when the client disconnects."""
        open_choices = len(choices)
        checked = quiet = time.monotonic()
        try:
            while open_choices:
                try:
                    index, item = await asyncio.wait_for(events.get(), timeout=DISCONNECT_CHECK)
                except TimeoutError:
                    index = None
                now = time.monotonic()
                if now - checked >= DISCONNECT_CHECK:  # also while tokens flow, for answers sent at the end
                    checked = now
                    if await http_request.is_disconnected():
                        return
                if index is None:
                    if keepalive is not None and now - quiet >= keepalive:
                        quiet = now
                        yield None, None
                    continue
                quiet = now
                choice = choices[index]
                if item is FINISHED:
                    open_choices -= 1
                elif choice.text.stopped:
                    continue  # tokens the engine made before it saw the cancel
                yield choice, item
        finally:
            for choice in choices:
                choice.request.cancel()  # a no-op for finished requests; frees the lanes of abandoned ones

    def raise_engine_error(self, choices) -> None:
        """A round that failed inside the engine (never bad input: that is refused before) is a 500."""
        for choice in choices:
            if choice.request.error is not None:
                log.error("the engine failed on a request", exc_info=choice.request.error)
                self.metrics.add("request_errors_total")
                raise APIError(500, f"the engine failed on this request: {choice.request.error!r}",
                               kind="InternalServerError")

    def usage(self, ids, choices) -> dict:
        completion = sum(len(c.output) for c in choices)
        return {"prompt_tokens": len(ids), "completion_tokens": completion, "total_tokens": len(ids) + completion,
                "prompt_tokens_details": {"cached_tokens": max(c.request.stats.cached_tokens for c in choices)}}

    def account(self, choices, started) -> None:
        for choice in choices:
            request = choice.request
            self.metrics.add("requests_total")
            self.metrics.add("generation_tokens_total", len(choice.output))
            self.metrics.add("drafted_rows_total", request.stats.drafted)
            self.metrics.add("accepted_rows_total", request.stats.accepted)
            self.metrics.add("draft_rounds_total", request.stats.draft_rounds)
            self.metrics.add("prompt_cache_hits_total", int(request.stats.cached_tokens > 0))
            if request.first_token_at is not None:
                self.metrics.first_token.observe(request.first_token_at - request.submitted)
        self.metrics.latency.observe(time.perf_counter() - started)

    def logprobs(self, choice, chat: bool, everything: bool = True):
        """OpenAI's logprobs object for the tokens handled since the last call (all of them if `everything`)."""
        request = choice.request
        if request.params.logprobs is None:
            return None
        first = 0 if everything else choice.logprobs_sent
        entries = request.logprobs[first:choice.tokens_seen]
        ids = choice.output[first:choice.tokens_seen]
        choice.logprobs_sent = choice.tokens_seen

        piece = self.piece
        if chat:
            return {"content": [{"token": piece(t), "logprob": lp, "bytes": self.token_bytes(t),
                                 "top_logprobs": [{"token": piece(i), "logprob": v, "bytes": self.token_bytes(i)}
                                                  for i, v in top]}
                                for t, (lp, top) in zip(ids, entries)]}
        return {"tokens": [piece(t) for t in ids], "token_logprobs": [lp for lp, _ in entries],
                "top_logprobs": [{piece(i): v for i, v in top} for _, top in entries]}

    def piece(self, token: int) -> str:
        """A token's text, alone (with U+FFFD for a part of a character)."""
        return self.model.tokenizer.decode([token])

    def echo_logprobs(self, choice, ids):
        """The completions API's logprobs of an echoed prompt: its first token has none (nothing predicts it)."""
        request = choice.request
        if request.params.prompt_logprobs is None:
            return None
        entries = [(None, None)] + request.prompt_logprobs
        return {"tokens": [self.piece(t) for t in ids[:len(entries)]], "token_logprobs": [lp for lp, _ in entries],
                "top_logprobs": [None if top is None else {self.piece(i): v for i, v in top} for _, top in entries]}

    @staticmethod
    def joined(first, second):
        """Two completions logprobs objects as one, list by list (either may be None)."""
        if first is None or second is None:
            return second if first is None else first
        return {key: first[key] + second[key] for key in first}

    def choice_extras(self, choice) -> dict:
        r = choice.request
        return {"token_sha256": token_sha256(choice.output),
                "stats": {"rounds": r.stats.rounds, "drafted": r.stats.drafted, "accepted": r.stats.accepted,
                          "draft_rounds": r.stats.draft_rounds, "cached_tokens": r.stats.cached_tokens}}

    async def completions(self, http_request):
        body = await self.body(http_request)
        protocol.check_fields(body, "completions")
        ids = await asyncio.to_thread(self.prompt_ids, body)
        generation = read_generation(body, default_max_tokens=16, chat=False, vocab_size=self.model.config.vocab_size,
                                     model_stop_ids=self.model.tokenizer.stop_ids)
        generation.params.grammar = await asyncio.to_thread(read_grammar, body, self.model, chat=False)
        echo = None
        if generation.echo:
            prompt = read_prompt(body, self.model.config.vocab_size)
            echo = prompt if isinstance(prompt, str) else self.model.tokenizer.decode(ids)
        return await self.generate(http_request, ids, generation, chat=None, echo=echo)

    async def chat_completions(self, http_request):
        body = await self.body(http_request)
        protocol.check_fields(body, "chat")
        ids, thinking = await asyncio.to_thread(self.render_chat, body)
        room = max(1, self.engine.context - len(ids))
        generation = read_generation(body, default_max_tokens=min(protocol.DEFAULT_CHAT_MAX_TOKENS, room), chat=True,
                                     vocab_size=self.model.config.vocab_size,
                                     model_stop_ids=self.model.tokenizer.stop_ids)
        generation.params.grammar = await asyncio.to_thread(read_grammar, body, self.model, True, thinking)
        return await self.generate(http_request, ids, generation, chat=thinking)

    async def generate(self, http_request, ids, generation, chat, echo=None):
        """Run the choices; `chat` is None for /v1/completions, else whether the prompt opened a think block;
        `echo`, the prompt's text that each completion choice starts with."""
        started = time.perf_counter()
        loop, events = asyncio.get_running_loop(), asyncio.Queue()
        choices = self.submit(ids, generation, events, loop)
        for choice in choices:
            choice.chat = ChatOutput(chat) if chat is not None else None
            choice.echo = echo
        reply_id = ("chatcmpl-" if chat is not None else "cmpl-") + uuid.uuid4().hex
        head = {"id": reply_id, "created": int(time.time()), "model": self.name}
        if generation.stream:
            return StreamingResponse(self.stream(http_request, ids, generation, choices, events, head, started),
                                     media_type="text/event-stream", headers=SSE_HEADERS)
        self.open_requests += 1
        try:
            return await self.answer(http_request, ids, generation, choices, events, head, started, chat)
        finally:
            self.open_requests -= 1

    async def answer(self, http_request, ids, generation, choices, events, head, started, chat):
        """The JSON answer of a request that does not stream."""
        async for choice, token in self.events(choices, events, http_request):
            if token is not FINISHED:
                choice.push(token)
        self.raise_engine_error(choices)
        for choice in choices:
            choice.text.finish()
            if choice.chat is not None:
                choice.chat.push(choice.text.text, final=True)
        self.account(choices, started)
        if chat is None:
            body = [{"index": c.index, "text": (c.echo or "") + c.text.text,
                     "logprobs": self.joined(self.echo_logprobs(c, ids) if c.echo is not None else None,
                                             self.logprobs(c, chat=False)),
                     "finish_reason": c.finish_reason,
                     **self.choice_extras(c)} for c in choices]
            return JSONResponse({**head, "object": "text_completion", "choices": body,
                                 "usage": self.usage(ids, choices)})
        body = []
        for c in choices:
            message = {"role": "assistant", "content": c.chat.content}
            if c.chat.reasoning:
                message["reasoning_content"] = message["reasoning"] = c.chat.reasoning
            calls = c.chat.tool_calls()
            if calls:
                message["tool_calls"] = calls
            body.append({"index": c.index, "message": message, "logprobs": self.logprobs(c, chat=True),
                         "finish_reason": "tool_calls" if calls else c.finish_reason, **self.choice_extras(c)})
        return JSONResponse({**head, "object": "chat.completion", "choices": body, "usage": self.usage(ids, choices)})

    async def stream(self, http_request, ids, generation, choices, events, head, started):
        """Server-sent events: one chunk per text delta, a final chunk per choice, usage if asked, [DONE]; a
        comment line after each `keepalive` seconds without one."""
        self.open_requests += 1
        try:
            async for event in self.events_stream(http_request, ids, generation, choices, events, head, started):
                yield event
        finally:
            self.open_requests -= 1

    async def events_stream(self, http_request, ids, generation, choices, events, head, started):
        chat = choices[0].chat is not None
        kind = "chat.completion.chunk" if chat else "text_completion"
        usage = {"usage": None} if generation.include_usage else {}

        def chunk(choice, delta=None, finish=None, logprobs=None, **extra):
            logprobs = logprobs or (self.logprobs(choice, chat, everything=False) if delta else None)
            if chat:
                item = {"index": choice.index, "delta": delta or {}, "logprobs": logprobs, "finish_reason": finish}
            else:
                item = {"index": choice.index, "text": (delta or {}).get("content", ""), "logprobs": logprobs,
                        "finish_reason": finish}
            return "data: " + json.dumps({**head, "object": kind, "choices": [{**item, **extra}], **usage}) + "\n\n"

        if chat:
            for choice in choices:
                yield chunk(choice, {"role": "assistant", "content": ""})
        async for choice, token in self.events(choices, events, http_request, self.keepalive):
            if choice is None:
                yield ": keep-alive\n\n"
                continue
            if choice.echo is not None:  # the prompt's text, once its logprobs (if asked) are all in
                yield chunk(choice, {"content": choice.echo}, logprobs=self.echo_logprobs(choice, ids))
                choice.echo = None
            if token is FINISHED and choice.request.error is not None:
                error = APIError(500, f"the engine failed on this request: {choice.request.error!r}",
                                 kind="InternalServerError")
                yield "data: " + json.dumps(error.body()) + "\n\n"
                continue
            if token is FINISHED:
                text = choice.text.finish()
                reasoning, content = choice.chat.push(text, final=True) if chat else ("", text)
            else:
                text = choice.push(token)
                reasoning, content = choice.chat.push(text) if chat else ("", text)
            if reasoning:
                yield chunk(choice, {"reasoning_content": reasoning, "reasoning": reasoning})
            if content:
                yield chunk(choice, {"content": content})
            if token is FINISHED:
                calls = choice.chat.tool_calls() if chat else []
                if calls:
                    yield chunk(choice, {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]})
                yield chunk(choice, finish="tool_calls" if calls else choice.finish_reason,
                            **self.choice_extras(choice))
        self.account(choices, started)
        if generation.include_usage:
            yield "data: " + json.dumps({**head, "object": kind, "choices": [],
                                         "usage": self.usage(ids, choices)}) + "\n\n"
        yield "data: [DONE]\n\n"
