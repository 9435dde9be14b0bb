"""Prometheus metrics (/metrics), written by prometheus_client.

Each app has a registry of its own (a process may hold several apps: tests
do). Counts that the engine and the gate already keep (cancels, gate
decisions) are read at scrape time, not copied, so they cannot drift."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _EngineCounts:
    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        e = self.engine
        yield CounterMetricFamily("vkspec_cancelled_turns", "turns whose client went away", value=e.cancelled)
        gate = getattr(e, "gate", None)
        fam = CounterMetricFamily("vkspec_gate_decisions", "the draft gate's decisions", labels=["decision"])
        if gate is not None:
            fam.add_metric(["declined"], gate.declined)
            fam.add_metric(["probe"], gate.probes)
            fam.add_metric(["forced_plain"], gate.forced_plain)
        yield fam


class Metrics:
    def __init__(self, engine):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("vkspec_requests", "requests by route", ["route"], registry=r)
        self.prompt_tokens = Counter("vkspec_prompt_tokens", "prompt tokens of turns", registry=r)
        self.prefilled = Counter("vkspec_prefilled_tokens", "prompt tokens fed (not reused)", registry=r)
        self.completion_tokens = Counter("vkspec_completion_tokens", "tokens generated", registry=r)
        self.turns = Counter("vkspec_turns", "turns run", registry=r)
        self.drafted = Counter("vkspec_drafted_tokens", "draft tokens verified", ["source"], registry=r)
        self.accepted = Counter("vkspec_accepted_tokens", "draft tokens accepted", ["source"], registry=r)
        self.decode_rate = Gauge("vkspec_decode_tokens_per_second", "the last turn's decode rate", registry=r)
        self.prefill_rate = Gauge("vkspec_prefill_tokens_per_second", "the last turn's prefill rate", registry=r)
        self.acceptance = Gauge("vkspec_acceptance_ratio", "accepted / drafted over all turns", registry=r)
        r.register(_EngineCounts(engine))
        self._drafted = self._accepted = 0

    def request(self, route: str):
        self.requests.labels(route).inc()

    def turn(self, turn, prompt_len: int):
        """The engine calls this after each turn (on its own thread)."""
        self.turns.inc()
        self.prompt_tokens.inc(prompt_len)
        fed = prompt_len - turn.reused
        self.prefilled.inc(fed)
        self.completion_tokens.inc(len(turn.tokens))
        if turn.prefill_s > 0 and fed:
            self.prefill_rate.set(fed / turn.prefill_s)
        if turn.decode_s > 0 and turn.tokens:
            self.decode_rate.set(len(turn.tokens) / turn.decode_s)
        c = turn.counters
        if c is not None:
            for name, (_, drafted, accepted) in c.by_source.items():
                self.drafted.labels(name or "none").inc(drafted)
                self.accepted.labels(name or "none").inc(accepted)
            self._drafted += c.drafted
            self._accepted += c.accepted
            if self._drafted:
                self.acceptance.set(self._accepted / self._drafted)

    def render(self) -> bytes:
        return generate_latest(self.registry)
