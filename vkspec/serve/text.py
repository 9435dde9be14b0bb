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
    """Turns tokens into text deltas. A delta is held back while the text ends
    in an incomplete UTF-8 sequence or could still become a stop string."""

    def __init__(self, tokenizer, stops: list[str]):
        self.tok, self.stops = tokenizer, [s for s in stops if s]
        self.ids: list[int] = []
        self.sent = 0                       # characters sent
        self.text = ""
        self.stopped = False

    def push(self, tok: int) -> str:
        self.ids.append(tok)
        self.text = self.tok.decode(self.ids) if self.tok else " ".join(map(str, self.ids))
        for s in self.stops:
            i = self.text.find(s, max(0, self.sent - len(s)))
            if i >= 0:
                self.text = self.text[:i]
                self.stopped = True
        if self.stopped:
            return self.flush()
        end = len(self.text)
        if self.text.endswith("\ufffd"):
            end = len(self.text.rstrip("\ufffd"))
        for s in self.stops:                # hold back a possible start of a stop string
            for k in range(min(len(s) - 1, end - self.sent), 0, -1):
                if s.startswith(self.text[end - k:end]):
                    end -= k
                    break
        return self._upto(end)

    def flush(self) -> str:
        return self._upto(len(self.text))

    def _upto(self, end: int) -> str:
        if end <= self.sent:
            return ""
        out, self.sent = self.text[self.sent:end], end
        return out
