"""What each step of a skill-bank run (`mode: bank`) did, from its events:
a label such as "distilled 2 (-1) · val 0.620 · evolved letter_counting ·
gated: accepted" (-1: one proposal dropped; "val 0.550 < 0.600: rolled back"
when the distilled skills made the bank worse), and the step's bank figures (bank size,
validation rate per category, retrieval hit rate) that `export-mlflow` logs.
A bank step is not an edit of a document: it has no edit budget, and a step
that only distils is not a "skip". Pure: events in, plain data out."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from skillstate.log.events import CandidateBuilt, GateDecided, RolloutCompleted
from skillstate.log.events_bank import BankEvolved, BankValidated, SkillsDistilled

_GATED = {"accept": "accepted", "accept_best": "accepted (new best)", "reject": "rejected"}


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def step_label(events: Iterable[Any]) -> str:
    """One step's label, from its events (in log order)."""
    parts: list[str] = []
    built = False
    for ev in events:
        if isinstance(ev, SkillsDistilled):
            part = f"distilled {len(ev.added)}" + (f" (-{len(ev.dropped)})" if ev.dropped else "")
            parts.append(part if ev.status == "ok" else f"{part}, teacher {ev.status}")
        elif isinstance(ev, BankValidated):
            rolled_back = f" < {_fmt(ev.checked_score)}: rolled back" if ev.kept is False else ""
            parts.append(f"val {_fmt(ev.scores.gate)}{rolled_back}")
        elif isinstance(ev, BankEvolved):
            if ev.status == "skipped":
                parts.append("nothing to evolve")
            elif ev.status == "no_failures":
                parts.append(f"evolve {', '.join(ev.categories)}: no train failure to show")
            else:
                cats = ", ".join(ev.categories) or "none"
                parts.append(f"evolved {cats}" + ("" if ev.status == "ok" else f" (teacher {ev.status})"))
        elif isinstance(ev, CandidateBuilt):
            built = True
        elif isinstance(ev, GateDecided) and built:
            parts.append(f"gated: {_GATED.get(ev.decision, ev.decision)}")
    return " · ".join(parts) or "in progress"


def _by_step(events: Iterable[Any]) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for ev in events:
        step = getattr(ev, "step", None)
        if isinstance(step, int) and step > 0:
            out.setdefault(step, []).append(ev)
    return out


def step_labels(events: Iterable[Any]) -> dict[int, str]:
    """Each step's label, by step."""
    return {step: step_label(evs) for step, evs in _by_step(events).items()}


def hit_rate(results: Iterable[Any]) -> float | None:
    """The share of rollouts whose retrieval put at least one skill in the prompt (None without rollouts)."""
    rows = list(results)
    return sum(1 for r in rows if r.retrieved) / len(rows) if rows else None


def step_metrics(events: Iterable[Any], bank_size: dict[int, int]) -> dict[int, dict[str, float]]:
    """Per step: `bank.size` (the current bank's skills after the step, from `bank_size`),
    `bank.retrieval_hit_rate` (of the step's rollout), `bank.validation.gate` and
    `bank.validation.by_task_type.<category>` (its hard rate), where the step has them."""
    out: dict[int, dict[str, float]] = {}
    for step, evs in _by_step(events).items():
        row: dict[str, float] = {}
        if step in bank_size:
            row["bank.size"] = float(bank_size[step])
        for ev in evs:
            if isinstance(ev, RolloutCompleted) and (rate := hit_rate(ev.results)) is not None:
                row["bank.retrieval_hit_rate"] = rate
            elif isinstance(ev, BankValidated):
                row["bank.validation.gate"] = float(ev.scores.gate)
                for category, score in ev.scores.by_task_type.items():
                    row[f"bank.validation.by_task_type.{category}"] = float(score.hard)
        out[step] = row
    return out
