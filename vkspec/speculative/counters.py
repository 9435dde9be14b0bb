"""What a run did: tokens per forward, acceptance by position, gate decisions."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Counters:
    forwards: int = 0            # forwards that fed decode tokens (verifies, plain steps, replays)
    verifies: int = 0            # forwards that carried drafts
    drafted: int = 0
    accepted: int = 0
    replays: int = 0
    carried: list = field(default_factory=lambda: [0] * 8)    # by draft position
    taken: list = field(default_factory=lambda: [0] * 8)
    by_source: dict = field(default_factory=dict)             # name -> [verifies, drafted, accepted]

    def forward(self, drafts: int, source: str | None):
        self.forwards += 1
        if drafts:
            self.verifies += 1
            self.drafted += drafts
            s = self.by_source.setdefault(source, [0, 0, 0])
            s[0] += 1
            s[1] += drafts
            for j in range(drafts):
                self.carried[j] += 1

    def settled(self, source: str, drafts: int, accepted: int):
        self.accepted += accepted
        self.by_source[source][2] += accepted
        for j in range(accepted):
            self.taken[j] += 1

    def replay(self):
        self.replays += 1
        self.forwards += 1

    def copy(self) -> "Counters":
        """Every round checkpoints the counters: a field-by-field copy (deepcopy
        cost a tenth of a trained-hybrid step on the CPU path)."""
        return Counters(self.forwards, self.verifies, self.drafted, self.accepted, self.replays,
                        list(self.carried), list(self.taken), {k: list(v) for k, v in self.by_source.items()})

    def as_dict(self, gate, sources) -> dict:
        d = dict(forwards=self.forwards, verifies=self.verifies, drafted=self.drafted,
                 accepted=self.accepted, replays=self.replays,
                 acceptance_by_position=[round(t / c, 4) if c else None
                                         for c, t in zip(self.carried, self.taken) if c],
                 by_source={k: dict(verifies=v[0], drafted=v[1], accepted=v[2])
                            for k, v in self.by_source.items()})
        if gate is not None:
            d.update(gate=dict(enabled=gate.enabled, declined=gate.declined, probes=gate.probes,
                               forced_plain=gate.forced_plain, summary=gate.summary()))
        for s in sources:
            v = getattr(getattr(s, "inner", s), "vocab", None)
            if v is not None and v.sizes:
                d["draft_vocab"] = dict(avg_size=sum(v.sizes) / len(v.sizes),
                                        picks_inside=v.picks_inside / max(v.picks, 1),
                                        appended=v.appended, rebuilds=v.rebuilds)
        return d

    def line(self, tokens: int) -> str:
        tpf = tokens / self.forwards if self.forwards else float(tokens)
        acc = f"{self.accepted / self.drafted:.1%}" if self.drafted else "-"
        pos = " ".join(f"{j + 1} {t / c:.0%} ({t}/{c})" for j, (c, t) in enumerate(zip(self.carried, self.taken)) if c)
        return (f"{tpf:.2f} tokens/forward ({self.forwards} forwards per {tokens} tokens) | acceptance {acc} "
                f"({self.accepted}/{self.drafted} drafts in {self.verifies} verifies) | replays {self.replays}"
                + (f" | by position: {pos}" if pos else ""))
