"""Request bodies of the OpenAI endpoints, validated with pydantic before anything reaches the model.

Fields are OpenAI's; a field OpenAI has that hetero does not implement is refused by name (``extra="forbid"``)
rather than silently ignored, except the bookkeeping ones clients send by default (``user``, ``metadata``, ...).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP = 4
MAX_TOKENS = 1 << 20
MAX_EMBEDDING_INPUTS = 256


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(default="", max_length=256)
    # accepted and ignored: bookkeeping that does not change the answer
    user: str | None = Field(default=None, max_length=256)
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = Field(default=None, max_length=64)


class _Sampling(_Body):
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=10)
    seed: int | None = Field(default=None, ge=0, lt=1 << 63)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    logit_bias: dict[str, float] | None = None
    n: Literal[1] = 1  # one choice per request
    response_format: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not key.isdigit():
                raise ValueError(f"logit_bias key {key!r} is not a token id")
            if not -100 <= bias <= 100:
                raise ValueError(f"logit_bias of token {key} is {bias}; expected -100 to 100")
        return value

    def sampling(self) -> dict[str, Any]:
        """The options every endpoint hands to ``hetero.llm.openai_api``; unset ones are left to the model."""
        names = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                 "repetition_penalty", "seed", "stop", "logit_bias", "response_format", "stream_options")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    parallel_tool_calls: bool | None = None

    def options(self) -> dict[str, Any]:
        options = self.sampling()
        options.update(max_tokens=self.max_tokens, max_completion_tokens=self.max_completion_tokens,
                       logprobs=self.logprobs, top_logprobs=self.top_logprobs, tools=self.tools,
                       tool_choice=self.tool_choice)
        return options

    def message_dicts(self) -> list[dict[str, Any]]:
        # the template knows "system", not OpenAI's newer name for it
        return [{**m.model_dump(exclude_none=True), "role": "system" if m.role == "developer" else m.role}
                for m in self.messages]


class CompletionRequest(_Sampling):
    prompt: str | list[int] = Field(min_length=1)
    max_tokens: int | None = Field(default=16, ge=1, le=MAX_TOKENS)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False

    def options(self) -> dict[str, Any]:
        return {**self.sampling(), "max_tokens": self.max_tokens, "logprobs": self.logprobs, "echo": self.echo}


class EmbeddingRequest(_Body):
    input: str | list[str] | list[int] | list[list[int]] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)

    @field_validator("input")
    @classmethod
    def _input(cls, value: Any) -> Any:
        if isinstance(value, list):
            if len(value) > MAX_EMBEDDING_INPUTS:
                raise ValueError(f"at most {MAX_EMBEDDING_INPUTS} inputs")
            if any(isinstance(v, str | list) and len(v) == 0 for v in value):
                raise ValueError("an input is empty")
        return value

    def inputs(self) -> list[str | list[int]]:
        """Each text or token-id list to embed (one token-id list is one input, as OpenAI reads it)."""
        if isinstance(self.input, str):
            return [self.input]
        items: list[Any] = list(self.input)
        return [items] if items and isinstance(items[0], int) else items
