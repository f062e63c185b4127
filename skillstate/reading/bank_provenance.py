"""Why is this skill in the bank? For a run in mode bank: the skills whose
id is TEXT, or whose title, principle or when_to_apply holds it, with the
event that added each (imported, distilled or evolved, and at which step),
the trajectories the teacher read and how they ended, the skill it refined,
the gate's decision on an evolved bank, and how many rollouts were shown it."""

from __future__ import annotations

from typing import Any

from skillstate.bank.document import read_bank
from skillstate.bank.skills import BankSkill
from skillstate.engine.loading import load_run
from skillstate.errors import UserError
from skillstate.log.events import GateDecided, RolloutCompleted, RunStarted
from skillstate.log.events_bank import BankEvolved, BankSeeded, SkillsDistilled
from skillstate.log.reducer import need
from skillstate.storage.store import Store


def _matches(skill: BankSkill, text: str) -> bool:
    low = text.casefold()
    return skill.id == text or any(low in part.casefold() for part in (skill.title, skill.principle,
                                                                         skill.when_to_apply))


def _outcome(outcomes: dict[tuple[int, str], str], step: int, item_id: str, origin: str,
             source: str | None) -> str:
    """How a trajectory the teacher read had ended. A distilled skill's: the rollout of the step that distilled
    it. An evolved skill's: a failure of the split its `BankEvolved` names as `source` (the step's rollouts on
    train, or the bank's validation on val); None where no event of the run says (a bank file's skill)."""
    if origin == "evolve":
        if source == "train":  # the step's own rollout of the item: how it failed there
            return f"failed on train ({outcomes.get((step, item_id), 'unknown')})"
        if source == "val":
            return "failed on validation"
        return "failed (a sampled failure)"
    if origin == "import":
        return "imported"
    return outcomes.get((step, item_id), "unknown")


def explain_bank(store: Store, run_id: str | None, text: str) -> dict[str, Any]:
    text = text.strip()
    if not text:
        raise UserError('give a skill id or some of its text, e.g. skillstate why "conversion factor"')
    loaded = load_run(store, run_id)
    state = loaded.state
    current = read_bank(store.get_blob(need(state.current_skill, "the current bank")))
    best = read_bank(store.get_blob(need(state.best_skill, "the best bank")))
    events = [s.event for s in loaded.lineage]
    added: dict[str, tuple[Any, BankSkill]] = {}
    for ev in events:
        if isinstance(ev, RunStarted):  # the bank file the run started from (initial_skill)
            for skill in read_bank(store.get_blob(ev.initial_skill)).skills:
                added.setdefault(skill.id, (ev, skill))
        elif isinstance(ev, (BankSeeded, SkillsDistilled, BankEvolved)):
            for skill in ev.added:
                added.setdefault(skill.id, (ev, skill))
    outcomes: dict[tuple[int, str], str] = {}  # (step, item id) -> how that step's rollout of it ended
    for ev in events:
        if isinstance(ev, RolloutCompleted):
            for r in ev.results:
                outcomes[(ev.step, r.item_id)] = "solved" if r.hard >= 1 else (r.fail_reason or "failed")
    gates = {ev.step: ev for ev in events if isinstance(ev, GateDecided)}
    shown: dict[str, int] = {}
    for ev in events:
        if isinstance(ev, RolloutCompleted):
            for r in ev.results:
                for x in r.retrieved:
                    shown[x.skill_id] = shown.get(x.skill_id, 0) + 1
    found = []
    for skill_id, (ev, skill) in added.items():
        if not _matches(skill, text):
            continue
        step = getattr(ev, "step", 0)
        gate = gates.get(step) if isinstance(ev, BankEvolved) else None
        refined = added.get(skill.provenance.refines or "")
        source = ev.source if isinstance(ev, BankEvolved) else None
        found.append({
            "id": skill_id, "title": skill.title, "principle": skill.principle, "category": skill.category,
            "when_to_apply": skill.when_to_apply, "origin": skill.provenance.origin, "event": ev.type, "step": step,
            "call": getattr(ev, "call", None) and ev.call.request_hash,
            "trajectories": [{"id": i, "outcome": _outcome(outcomes, skill.provenance.step, i,
                                                           skill.provenance.origin, source)}
                             for i in skill.provenance.trajectories],
            "refines": ({"id": skill.provenance.refines, "principle": refined[1].principle} if refined else
                        skill.provenance.refines),
            "gate": {"decision": gate.decision, "reason": gate.reason} if gate else None,
            "in_current_bank": current.by_id(skill_id) is not None, "in_best_bank": best.by_id(skill_id) is not None,
            "rollouts_shown": shown.get(skill_id, 0),
        })
    return {"run_id": loaded.run_id, "text": text, "found": bool(found), "skills": found}


def bank_why_text(info: dict[str, Any]) -> str:
    lines = [f"run {info['run_id']}: {len(info['skills'])} skill(s) of the bank match {info['text']!r}"]
    for s in info["skills"]:
        where = " and ".join(n for n, k in (("current", "in_current_bank"), ("best", "in_best_bank")) if s[k])
        where = f"in the {where} bank" if where else "in neither the current nor the best bank"
        lines.append(f"- {s['id']} {s['title']!r} ({s['category'] or 'general'}; {where}): {s['principle']}")
        if s["event"] == RunStarted.type:
            lines.append(f"  in the bank file the run started from (initial_skill; origin {s['origin']}); shown to "
                         f"{s['rollouts_shown']} rollouts")
        else:
            lines.append(f"  added by {s['event']} at step {s['step']} ({s['origin']}), teacher call "
                         f"{(s['call'] or '-')[:12]}; shown to {s['rollouts_shown']} rollouts")
        if s["refines"]:
            ref = s["refines"]
            lines.append(f"  refines {ref if isinstance(ref, str) else ref['id'] + ': ' + ref['principle']}")
        if s["gate"]:
            lines.append(f"  the evolved bank: {s['gate']['decision']} ({s['gate']['reason']})")
        if s["trajectories"]:
            shown = ", ".join(f"{t['id']} {t['outcome'][:40]}" for t in s["trajectories"][:6])
            more = f" and {len(s['trajectories']) - 6} more" if len(s["trajectories"]) > 6 else ""
            lines.append(f"  from trajectories: {shown}{more}")
    return "\n".join(lines)


def is_bank_run(store: Store, run_id: str | None) -> bool:
    return load_run(store, run_id).state.config.get("mode") == "bank"



