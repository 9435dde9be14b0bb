"""Request bodies: strict JSON, then the OpenAI request shapes with vkspec's
limits. Whatever is wrong becomes an ApiError (a 4xx with one line); nothing
a client sends may reach the tokenizer or the sampler unchecked."""

from __future__ import annotations

import json
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SEED_MAX = 2 ** 63 - 1          # seeds are 0..2**63-1 (what secrets.randbits(63) draws)
MAX_STOPS = 4
MAX_STOP_BYTES = 256            # UTF-8 bytes of one stop string
MAX_CHOICES = 8                 # n: the choices run one after another, each a whole turn
MAX_BIAS = 1024                 # logit_bias entries
MAX_GRAMMAR = 1 << 16           # characters of a grammar field
MAX_TOOLS = 128


class ApiError(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes):
    """Strict JSON (no NaN or Infinity literals) whose strings are all valid
    Unicode: a lone surrogate ("\\ud800") would fail later, in the tokenizer or
    in the JSON of the answer."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise ApiError("the body is not valid JSON (nested too deeply)") from None
    except ValueError as e:             # JSONDecodeError, UnicodeDecodeError, too many digits, NaN
        raise ApiError(f"the body is not valid JSON ({e})") from None
    stack = [(data, "")]
    while stack:                        # no recursion: the depth is the client's
        v, where = stack.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                _check_text(k, where or "body")
                stack.append((x, f"{where}.{k}" if where else k))
        elif isinstance(v, list):
            stack.extend((x, f"{where}.{i}") for i, x in enumerate(v))
        elif isinstance(v, str):
            _check_text(v, where)
    return data


def _check_text(s: str, where: str):
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(f"{where}: a lone surrogate is not text", where or None) from None


def validation_message(e: ValidationError):
    err = e.errors()[0]
    param = ".".join(str(x) for x in err["loc"]) or None
    if err["type"] == "extra_forbidden":
        return f"unknown field {param!r}", param
    return f"{param}: {err['msg']}", param


def validate(data, cls):
    if not isinstance(data, dict):
        raise ApiError("the body must be a JSON object")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        msg, param = validation_message(e)
        raise ApiError(msg, param) from None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class Common(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    user: str | None = None
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0, allow_inf_nan=False)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = None

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, bias):
        if bias is None:
            return None
        if len(bias) > MAX_BIAS:
            raise ValueError(f"at most {MAX_BIAS} entries")
        for k, v in bias.items():
            if not k.isascii() or not k.isdigit() or len(k) > 9:
                raise ValueError(f"keys are token ids, got {k[:20]!r}")
            if not -100.0 <= v <= 100.0:
                raise ValueError("values are in -100..100")
        return bias

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop):
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        for s in stops:
            if len(s.encode("utf-8")) > MAX_STOP_BYTES:
                raise ValueError(f"a stop string is at most {MAX_STOP_BYTES} bytes of UTF-8")
        return stop

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class JsonSchemaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field("response", max_length=64)
    description: str | None = None
    schema_: dict | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class Structured(Common):
    response_format: ResponseFormat | None = None
    grammar: str | None = Field(None, max_length=MAX_GRAMMAR)    # GBNF or Lark (llguidance)


class CompletionRequest(Structured):
    prompt: Union[str, list[int]]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: Literal[False] = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    arguments: str


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=128)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(Structured):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Union[Literal["auto", "none", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool = True


class PinRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)
    prompt: Union[str, list[int], None] = None
    messages: list[Message] | None = None


class TokenizeRequest(BaseModel):
    """llama-server's /tokenize (model: vLLM's, accepted and checked)."""
    model_config = ConfigDict(extra="forbid")
    content: str | None = None
    prompt: str | None = None                 # vLLM's name for content
    model: str | None = None
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: list[int]
    model: str | None = None
