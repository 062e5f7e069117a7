"""The OpenAI-compatible HTTP server: a Starlette app over ``hetero.llm.openai_api`` and the slot ``Scheduler``.

Every error is an OpenAI error object (``{"error": {"message", "type", "param", "code"}}``): a body that is not
JSON, too large, or fails the schema is 4xx; a full queue is 429; anything unexpected is a 500 whose body names no
code (the traceback goes to the server's log, never to the client).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..contract.errors import HeteroError
from ..llm.openai_api import ContextLengthError, chat_prompt, create_chat_completion, create_completion
from ..llm.prefix_cache import PrefixCache
from .metrics import CONTENT_TYPE_LATEST, Metrics
from .scheduler import QueueFull, Scheduler
from .schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from .streams import StreamStore

log = logging.getLogger("hetero.serve")
MAX_BODY_BYTES = 4 << 20  # a request body larger than this is refused (413) before it is parsed


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "1"} if self.status == 429 else None
        return JSONResponse({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status, headers=headers)


def create_app(models: list[Any], *, name: str | None = None, max_queue: int = 16,
               max_body_bytes: int = MAX_BODY_BYTES, prefix_cache_bytes: int = 0, prefix_min_tokens: int = 32,
               resume_window: float = 0.0, prefix_cache_dir: str | os.PathLike | None = None) -> Starlette:
    """An app serving ``models`` (one per slot: the sequences of one model loaded with ``slots=N``, whose decode
    steps are batched, or separate models) under the model
    id ``name`` (default: the first model's name). ``prefix_cache_bytes`` > 0: computed prompts are kept (up to
    that many bytes, shared by the slots) for the requests that start the same way (``hetero.llm.prefix_cache``);
    ``prefix_cache_dir``: they are also written there as prefix-cache files, found again after a restart.
    ``resume_window`` > 0: a stream whose client went away keeps going that many seconds, resumable by its id
    (``hetero.serve.streams``)."""
    scheduler = Scheduler(models, max_queue)
    prefix_cache = PrefixCache(prefix_cache_bytes, prefix_min_tokens, prefix_cache_dir) \
        if prefix_cache_bytes > 0 or prefix_cache_dir is not None else None
    for model in models:
        model.prefix_cache = prefix_cache
    if prefix_cache_dir is not None:
        with contextlib.suppress(HeteroError):  # the model's content hash now, not in the first request (seconds
            models[0].identity.digest()  # for a GB); a model without one is said at the first prompt
    streams = StreamStore(resume_window)
    metrics = Metrics(scheduler, prefix_cache, streams)
    model_id = name or models[0].name
    started = int(time.time())
    first = models[0]
    embeddings_enabled = all(m.embeddings for m in models)

    async def read_body(request: Request, schema: type[BaseModel]) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > max_body_bytes):
            raise ApiError(413, f"the request body is larger than {max_body_bytes} bytes", code="body_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise ApiError(413, f"the request body is larger than {max_body_bytes} bytes", code="body_too_large")
            chunks.append(chunk)
        try:
            data = json.loads(b"".join(chunks))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise ApiError(400, f"the request body is not JSON: {exc}", code="invalid_json") from None
        if not isinstance(data, dict):
            raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}")
        try:
            body = schema.model_validate(data)
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(p) for p in problem["loc"])
            raise ApiError(400, f"{where}: {problem['msg']}", param=where or None) from None
        asked = getattr(body, "model", "")
        if asked not in ("", model_id):
            raise ApiError(404, f"the model {asked!r} does not exist; this server has {model_id!r}",
                           code="model_not_found", param="model")
        return body

    async def generate(endpoint: str, stream: bool, work: Callable[[Any], Any], prompt: list[int]) -> Response:
        """Run ``work(model)`` on a slot: its result as JSON, or with ``stream`` its chunks as server-sent events."""

        def run(model: Any) -> Iterator[Any]:
            result = work(model)
            if not stream:
                yield result
                return
            try:
                yield from result
            finally:
                result.close()
                metrics.generation(result.usage.timings())

        events = scheduler.run(run, prompt)
        if not stream:
            try:
                result = await anext(events)
            finally:
                await events.aclose()
            metrics.generation(result["timings"])
            metrics.count(endpoint, 200)
            return JSONResponse(result)
        try:
            first_chunk = await anext(events)  # errors in the prompt surface here, as a status code
        except StopAsyncIteration:
            first_chunk = None
        metrics.count(endpoint, 200)
        stream_id = str((first_chunk.get("id") if isinstance(first_chunk, dict) else None) or uuid.uuid4().hex)
        if resume_window <= 0:  # nothing kept: the client's reading drives the generation
            return _event_stream(_sse(first_chunk, events), stream_id)
        kept = streams.start(stream_id, _sse(first_chunk, events))
        return _event_stream(streams.follow(kept), kept.id)

    async def resume(request: Request) -> Response:
        stream_id = request.path_params["stream_id"]
        kept = streams.get(stream_id)
        if kept is None:
            raise ApiError(404, f"no stream {stream_id!r} to resume: unknown, or its {resume_window:g} s window "
                           "has passed" + ("" if resume_window > 0 else " (this server keeps none: --resume-window)"),
                           code="stream_not_found")
        after = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
        if not after.isdigit():
            raise ApiError(400, f"Last-Event-ID / after is {after[:40]!r}; expected the number of the last event "
                           "received", param="after")
        streams.resumed += 1
        return _event_stream(streams.follow(kept, int(after)), kept.id)

    async def chat_completions(request: Request) -> Response:
        body: ChatCompletionRequest = await read_body(request, ChatCompletionRequest)
        messages, options = body.message_dicts(), body.options()
        prompt = chat_prompt(first, messages, body.tools if body.tool_choice != "none" else None)
        return await generate("chat", body.stream, lambda llm: create_chat_completion(
            llm, messages, stream=body.stream, **options), prompt)

    async def completions(request: Request) -> Response:
        body: CompletionRequest = await read_body(request, CompletionRequest)
        options = body.options()
        prompt = first.tokenize(body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
        return await generate("completions", body.stream, lambda llm: create_completion(
            llm, body.prompt, stream=body.stream, **options), prompt)

    async def embeddings(request: Request) -> Response:
        body: EmbeddingRequest = await read_body(request, EmbeddingRequest)
        inputs = body.inputs()
        if not embeddings_enabled:
            raise ApiError(400, "this server does not compute embeddings: start it with --embeddings",
                           code="embeddings_disabled", param="input")
        if body.dimensions is not None and body.dimensions > first.config.hidden_size:
            raise ApiError(400, f"dimensions={body.dimensions}; this model's embeddings have "
                           f"{first.config.hidden_size}", param="dimensions")

        def work(llm: Any) -> Iterator[Any]:
            yield [(llm.embed(item), len(llm.tokenize(item)) if isinstance(item, str) else len(item))
                   for item in inputs]

        events = scheduler.run(work)
        try:
            vectors = await anext(events)
        finally:
            await events.aclose()
        data = [{"object": "embedding", "index": i, "embedding": _encode(v, body.dimensions, body.encoding_format)}
                for i, (v, _) in enumerate(vectors)]
        tokens = sum(n for _, n in vectors)
        metrics.prompt_tokens.inc(tokens)
        metrics.count("embeddings", 200)
        return JSONResponse({"object": "list", "data": data, "model": model_id,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def list_models(request: Request) -> Response:
        metrics.count("models", 200)
        return JSONResponse({"object": "list", "data": [_model_card(model_id, started, first)]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "slots": len(models), "slots_busy": scheduler.busy,
                             "queue_depth": scheduler.waiting})

    async def prometheus(request: Request) -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    def endpoint_of(request: Request) -> str:
        path = request.url.path
        return {"/v1/chat/completions": "chat", "/v1/completions": "completions",
                "/v1/embeddings": "embeddings"}.get(path, "other")

    async def api_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, ApiError):
            error = exc
        elif isinstance(exc, QueueFull):
            error = ApiError(429, f"the server is busy: {exc}; retry later", kind="rate_limit_error",
                             code="queue_full")
        elif isinstance(exc, ContextLengthError):
            error = ApiError(400, str(exc), code="context_length_exceeded", param="messages")
        elif isinstance(exc, HeteroError):
            error = ApiError(400, str(exc))
        elif isinstance(exc, HTTPException):
            error = ApiError(exc.status_code, exc.detail or "not found",
                             kind="invalid_request_error" if exc.status_code < 500 else "server_error")
        else:
            log.exception("internal error on %s", request.url.path)
            error = ApiError(500, "internal server error (see the server's log)", kind="server_error")
        metrics.count(endpoint_of(request), error.status)
        return error.response()

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/streams/{stream_id}", resume, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ]
    handlers: dict[Any, Callable[..., Any]] = {Exception: api_error, HTTPException: api_error, ApiError: api_error,
                                               HeteroError: api_error, QueueFull: api_error}
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        streams.close()
        scheduler.close()

    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.scheduler, app.state.metrics = scheduler, metrics
    return app


async def _sse(first: Any, events: AsyncGenerator[Any, None]) -> AsyncIterator[bytes]:
    """Server-sent events: one ``data:`` line per chunk, then ``[DONE]``; an error after the first chunk (the
    status line is sent) becomes an error event. Leaving early (the client went away) cancels the generation."""
    try:
        if first is not None:
            yield _event(first)
            async for chunk in events:
                yield _event(chunk)
    except HeteroError as exc:
        yield _event({"error": {"message": str(exc), "type": "invalid_request_error", "param": None, "code": None}})
    except Exception:
        log.exception("internal error while streaming")
        yield _event({"error": {"message": "internal server error (see the server's log)", "type": "server_error",
                                "param": None, "code": None}})
    finally:
        await events.aclose()  # frees the slot
    yield b"data: [DONE]\n\n"


def _event_stream(events: AsyncIterator[bytes], stream_id: str) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Stream-Id": stream_id})


def _event(data: Any) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def _encode(vector: Any, dimensions: int | None, encoding: str) -> Any:
    """An embedding as OpenAI sends it: truncated to ``dimensions`` and normalised again (Matryoshka-style), as
    floats or as base64 of little-endian float32."""
    if dimensions is not None:
        vector = vector[:dimensions]
        norm = float(np.linalg.norm(vector))
        vector = vector / norm if norm > 0 else vector
    if encoding == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return [float(x) for x in vector]


def _model_card(model_id: str, created: int, llm: Any) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "hetero",
            "meta": {"context": llm.context, "family": llm.config.family, "quant": llm.quant,
                     "kv_cache": llm.kv_cache}}
