"""Text around the token stream: chat templates, incremental detokenisation
and stop strings, deterministic in the token sequence (so a run with drafts
sends the frames a run without drafts sends)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import VkspecError


def chat_template(model_dir) -> str | None:
    """tokenizer_config.json's chat_template, if the model has one."""
    p = Path(model_dir) / "tokenizer_config.json"
    if not p.exists():
        return None
    try:
        t = json.loads(p.read_text()).get("chat_template")
    except (OSError, json.JSONDecodeError) as e:
        raise VkspecError(f"{p}: unreadable ({e})") from None
    if isinstance(t, list):                     # named templates: take "default"
        t = next((x.get("template") for x in t if x.get("name") == "default"), None)
    return t


def render_chat(template: str, messages: list[dict], extra: dict | None = None) -> str:
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise TemplateError(msg)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            **(extra or {}))


class TextStream:
    """Turns tokens into text deltas, decoding only a short window per token
    (never the whole reply again): the text of ids[prefix:] minus the text
    of ids[prefix:read], where ids[prefix:read] is the last piece that was
    appended (the context a decoder needs for spaces at a piece's start).
    A piece waits while it ends in an incomplete UTF-8 sequence (U+FFFD),
    for at most WINDOW tokens (then its bytes go out as decoded: a sequence
    that long is not text). A delta is also held back while the text could
    still become a stop string. Everything depends on the token sequence
    alone, so a run with drafts sends the frames of a run without."""

    WINDOW = 16

    def __init__(self, tokenizer, stops: list[str]):
        self.tok, self.stops = tokenizer, [s for s in stops if s]
        self.ids: list[int] = []
        self.prefix = self.read = 0         # ids[:read] are in the text
        self.sent = 0                       # characters sent
        self.text = ""
        self.stopped = False

    def push(self, tok: int) -> str:
        if self.stopped:                    # the turn ends on a stop string: nothing after it
            return ""
        self.ids.append(tok)
        self._extend(force=False)
        return self._deliver(final=False)

    def flush(self) -> str:
        if not self.stopped:
            self._extend(force=True)
        return self._deliver(final=True)

    def _extend(self, force: bool):
        n = len(self.ids)
        if self.read == n:
            return
        if self.tok is None:
            self.text += " ".join(map(str, self.ids[self.read:])) if self.read == 0 else \
                "".join(f" {t}" for t in self.ids[self.read:])
            self.read = n
            return
        before = self.tok.decode(self.ids[self.prefix:self.read])
        after = self.tok.decode(self.ids[self.prefix:])
        if not force and n - self.read < self.WINDOW and (len(after) <= len(before) or after.endswith("\ufffd")):
            return
        self.text += after[len(before):]
        self.prefix, self.read = self.read, n

    def _deliver(self, final: bool) -> str:
        if self.stopped:
            return self._upto(len(self.text))
        for s in self.stops:
            i = self.text.find(s, max(0, self.sent - len(s)))
            if i >= 0:
                self.text = self.text[:i]
                self.stopped = True
        if self.stopped or final:
            return self._upto(len(self.text))
        end = len(self.text)
        for s in self.stops:                # hold back a possible start of a stop string
            for k in range(min(len(s) - 1, end - self.sent), 0, -1):
                if s.startswith(self.text[end - k:end]):
                    end -= k
                    break
        return self._upto(end)

    def _upto(self, end: int) -> str:
        if end <= self.sent:
            return ""
        out, self.sent = self.text[self.sent:end], end
        return out
