"""Structured output: response_format (json_object, json_schema), a grammar
field (GBNF or Lark) and forced tool calls, compiled and matched by
llguidance (docs/server.md says why llguidance and what its mask costs).

A Constraint is part of a Sampler: the mask of a row follows from the picks
before it (the matcher consumes each pick, and rolls back with the
sampler's state), so a verify's rows are masked exactly as plain decoding
masks them and a draft that leaves the grammar is never accepted."""

from __future__ import annotations

import json
import threading

import numpy as np

from .schema import ApiError

# a JSON value of any shape: what json_object asks for (an object at the top)
ANY_OBJECT = {"type": "object"}
# whitespace between JSON tokens is bounded: a model can otherwise spin in
# newlines until max_tokens, which no client wants
JSON_OPTIONS = {"whitespace_flexible": False}


class Constraint:
    def __init__(self, matcher, vocab: int):
        self.m, self.vocab = matcher, vocab

    def allowed(self) -> np.ndarray:
        bits = np.frombuffer(self.m.compute_bitmask(), np.uint8)
        return np.unpackbits(bits, bitorder="little")[:self.vocab].astype(bool)

    def consume(self, tok: int):
        if not self.m.consume_token(tok):
            # a pick is always inside the mask; this is a bug, not bad input
            raise RuntimeError(f"the grammar refused token {tok}: {self.m.get_error()}")

    def rollback(self, k: int):
        self.m.rollback(k)

    @property
    def finished(self) -> bool:
        return self.m.is_stopped()


class Grammars:
    """Compiles a request's constraint once (errors are a 400) and makes a
    fresh matcher per choice. The LLTokenizer is built on first use."""

    def __init__(self, tokenizer, vocab: int, eos: set[int]):
        self.tokenizer, self.vocab, self.eos = tokenizer, vocab, sorted(eos)
        self._llt, self._lock = None, threading.Lock()

    def llt(self):
        import llguidance
        with self._lock:
            if self._llt is None:
                if self.tokenizer is None or not hasattr(self.tokenizer, "tk"):
                    raise ApiError("structured output needs the model's tokenizer", code="no_tokenizer")
                self._llt = llguidance.LLTokenizer(self.tokenizer.tk.to_str(), n_vocab=self.vocab,
                                                   eos_token=self.eos or None)
            return self._llt

    def compile(self, grammar: str, param: str):
        """A matcher factory for an llguidance grammar (400 if it does not compile)."""
        import llguidance
        llt = self.llt()
        err = llguidance.LLMatcher.validate_grammar(grammar, llt)
        if err:
            raise ApiError(f"{param}: {one_line(err)}", param, "invalid_grammar")
        return lambda: Constraint(llguidance.LLMatcher(llt, grammar, log_level=0), self.vocab)

    @staticmethod
    def json_grammar(schema, param: str) -> str:
        import llguidance
        if not isinstance(schema, dict):
            raise ApiError(f"{param}: a JSON schema is an object", param, "invalid_schema")
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except ValueError as e:
            raise ApiError(f"{param}: {one_line(str(e))}", param, "invalid_schema") from None

    def json_schema(self, schema, param: str):
        return self.compile(self.json_grammar(schema, param), param)

    def lark_text(self, lark: str, param: str):
        import llguidance
        return self.compile(llguidance.LLMatcher.grammar_from_lark(lark), param)

    def lark(self, text: str, param: str = "grammar"):
        import llguidance
        from llguidance.gbnf_to_lark import any_to_lark
        try:
            lark = any_to_lark(text)            # GBNF becomes Lark; Lark stays
        except Exception as e:                  # noqa: BLE001 - the converter's own errors
            raise ApiError(f"{param}: {one_line(str(e))}", param, "invalid_grammar") from None
        return self.compile(llguidance.LLMatcher.grammar_from_lark(lark), param)


def one_line(msg: str) -> str:
    lines = [x.strip() for x in msg.strip().splitlines() if x.strip()]
    return lines[0][:300] if lines else "invalid"


def check_schema(schema, param: str):
    """A 400 unless `schema` compiles as a JSON schema (llguidance's checks)."""
    import llguidance
    g = Grammars.json_grammar(schema, param)
    err = llguidance.LLMatcher.validate_grammar(g)
    if err:
        raise ApiError(f"{param}: {one_line(err)}", param, "invalid_schema")


def response_constraint(req, grammars: Grammars):
    """The matcher factory a chat / completion request asks for, or None."""
    rf, grammar = getattr(req, "response_format", None), getattr(req, "grammar", None)
    if rf is not None and grammar is not None:
        raise ApiError("send at most one of response_format and grammar", "grammar")
    if grammar is not None:
        return grammars.lark(grammar)
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return grammars.json_schema(ANY_OBJECT, "response_format")
    js = rf.json_schema
    if js is None or js.schema_ is None:
        raise ApiError("response_format.json_schema.schema is required", "response_format.json_schema")
    return grammars.json_schema(js.schema_, "response_format.json_schema.schema")


def dumps(v) -> str:
    return json.dumps(v, ensure_ascii=False)
