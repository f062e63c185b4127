"""Reading events back: the registry of event types by name, the
upcasters that turn a payload stored under an older schema version into the
current one, and `decode`/`encode` between stored payloads and events.
Stored rows are never rewritten; an old version is upcast on read.
(`skillstate.log.events` holds the event classes themselves.)"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from skillstate.errors import CorruptLogError, InternalError
from skillstate.log.events import (
    BaselineEvaluated,
    CandidateBuilt,
    CandidateEvaluated,
    EditsSelected,
    Event,
    GateDecided,
    LearningRateChosen,
    PatchesMerged,
    PatchProposed,
    RolloutCompleted,
    RunCompleted,
    RunForked,
    RunStarted,
    StepStarted,
    StopConditionMet,
    TestEvaluated,
)
from skillstate.log.events_bank import BankEvolved, BankSeeded, BankValidated, SkillsDistilled
from skillstate.log.events_blocker import BlockerSearched
from skillstate.log.events_check import CandidateChecked
from skillstate.log.events_epoch import (
    EpochCompared,
    EpochEnded,
    FinalValidated,
    MetaSkillWritten,
    SlowUpdateDecided,
    SlowUpdateProposed,
)
from skillstate.log.events_pareto import ParentChosen
from skillstate.log.events_policy import PolicyBankEvolved, PolicyStarted, PolicyTrained, PolicyValidated
from skillstate.log.events_repair import EditsAblated
from skillstate.log.events_review import ReviewDecided, ReviewRequested
from skillstate.log.events_screen import EditsScreened
from skillstate.log.prune_events import PruneDecided, PruneProposed
from skillstate.log.selection_events import FinalSelected, SelectionScored

EVENT_TYPES: dict[str, type[Event]] = {
    cls.type: cls
    for cls in (
        RunStarted, RunForked, BaselineEvaluated, RunCompleted, StepStarted, RolloutCompleted,
        PatchProposed, PatchesMerged, LearningRateChosen, EditsSelected, CandidateBuilt, CandidateEvaluated,
        GateDecided, TestEvaluated, EpochCompared, SlowUpdateProposed, SlowUpdateDecided, MetaSkillWritten,
        EpochEnded, FinalValidated, StopConditionMet, SkillsDistilled, BankValidated, BankEvolved, BankSeeded,
        PruneProposed, PruneDecided,
        EditsAblated, ParentChosen, BlockerSearched, EditsScreened, CandidateChecked,
        SelectionScored, FinalSelected,
        PolicyStarted, PolicyTrained, PolicyValidated, PolicyBankEvolved,
        ReviewRequested, ReviewDecided,
    )
}

# (type, stored version) -> function turning that version's payload into the
# next version's. Register one per schema change; never edit stored rows.
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


def _v1_config(payload: dict[str, Any]) -> dict[str, Any]:
    """v1 runs predate the step buffer, which is on by default since v2:
    a v1 config without the key meant no buffer."""
    config = dict(payload.get("config", {}))
    config.setdefault("use_step_buffer", False)
    return {**payload, "config": config}


def _v2_config(payload: dict[str, Any]) -> dict[str, Any]:
    """v2 runs predate dropping edits that change nothing and the early-reject
    gate, both on by default since v3: a v2 config without the keys meant
    neither (so its log re-executes as it was written)."""
    config = dict(payload.get("config", {}))
    config.setdefault("drop_noop_edits", False)
    config.setdefault("early_reject", False)
    return {**payload, "config": config}


def _v3_config(payload: dict[str, Any]) -> dict[str, Any]:
    """v3 runs rejected early at the step gate only; since v4 the gated slow
    update does too, unless early_reject_slow_update is false."""
    config = dict(payload.get("config", {}))
    config.setdefault("early_reject_slow_update", False)
    return {**payload, "config": config}


def _v4_started(payload: dict[str, Any]) -> dict[str, Any]:
    """v5 adds `trajectories` (mode bank's imported trajectories); a v4 run had none."""
    return payload


def _v5_config(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs written before RunStarted v6 (RunForked v5) had neither the repair
    nor the screen of edits rejected before on by default: a config without
    the keys meant both off (so its log re-executes as it was written)."""
    config = dict(payload.get("config", {}))
    config.setdefault("repair", "off")
    config.setdefault("drop_rejected_edits", 0)
    config.setdefault("repair_full_evaluation", False)  # early reject applied to the candidates it repaired
    return {**payload, "config": config}


def _v6_config(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs written before RunStarted v7 (RunForked v6) ablated whole edits
    only and paired every item the gate scored: a config without the keys
    meant `repair_clauses` and `repair_prefix` off."""
    config = dict(payload.get("config", {}))
    config.setdefault("repair_clauses", False)
    config.setdefault("repair_prefix", False)
    return {**payload, "config": config}


def _v7_front_matter(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs written before RunStarted v8 (RunForked v7) trained a markdown
    file, with no skill tree, and edited a front matter that opened it like
    any other text: a config without the key meant `protect_front_matter`
    off."""
    config = dict(payload.get("config", {}))
    config.setdefault("protect_front_matter", False)
    return {**payload, "config": config}


def _v8_distractors(payload: dict[str, Any]) -> dict[str, Any]:
    """RunStarted v9 may name distractor skills (`distractors`, disclosure tools); a v8 run installed none."""
    return payload


def _v9_train_files(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs written before RunStarted v10 (RunForked v8) trained SKILL.md alone, whatever their disclosure: a
    config without the key meant `train_files: skill_md`."""
    config = dict(payload.get("config", {}))
    config.setdefault("train_files", "skill_md")
    return {**payload, "config": config}


def _v10_bank(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs written before RunStarted v11 (RunForked v9) in mode bank showed the evolving teacher val's failures,
    kept distilled skills ungated, retrieved by the task's description alone with no floor, and put every
    common mistake in every prompt: a config without the keys meant that."""
    config = dict(payload.get("config", {}))
    bank = dict(config.get("bank") or {})
    for key, value in (("evolve_from", "val"), ("gate_distillation", False), ("min_retrieved", 0),
                       ("query_category", False), ("mistakes_k", 0)):
        bank.setdefault(key, value)
    return {**payload, "config": {**config, "bank": bank}}


def _v11_selection(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs written before RunStarted v12 (RunForked v10) selected a directory's edits one by one, whatever links
    they left pointing at nothing, and had neither the blocker search nor the prune (with its test of the lowest
    type) on by default: a config without the keys meant them off."""
    config = dict(payload.get("config", {}))
    for key, value in (("keep_links_whole", False), ("blocker_search", "off"), ("prune", "off"),
                       ("prune_blockers", False)):
        config.setdefault(key, value)
    return {**payload, "config": config}


def _v12_ablation(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs written before RunStarted v13 (RunForked v11) rolled out every blocker ablation on every item and
    scored val items for early reject with the current skill's failures first: a config without the keys
    meant `blocker_ablation: each` and `eval_order: failed_first`."""
    config = dict(payload.get("config", {}))
    config.setdefault("blocker_ablation", "each")
    config.setdefault("eval_order", "failed_first")
    return {**payload, "config": config}


def _v13_screen(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs written before RunStarted v14 (RunForked v12) screened no edit unless told to, and skipped a step
    whose screened edits all failed their minibatches: a config without the keys meant `edit_screen: off`
    and `edit_screen_fallback: none` (their `prune_blockers` is in every such config, or set by `_v11`)."""
    config = dict(payload.get("config", {}))
    config.setdefault("edit_screen", "off")
    config.setdefault("edit_screen_fallback", "none")
    return {**payload, "config": config}


def _v14_screen_and_ablation(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs written before RunStarted v15 (RunForked v13) tried each screened edit on its whole minibatch and
    stopped each grouped blocker ablation on its own: a config without the keys meant `edit_screen_early:
    false` and `blocker_stop_by_line: false`."""
    config = dict(payload.get("config", {}))
    config.setdefault("edit_screen_early", False)
    config.setdefault("blocker_stop_by_line", False)
    return {**payload, "config": config}


def _v15_screened(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs written before RunStarted v16 (RunForked v14) searched only the types the kept edits aimed at: a
    config without the key meant `blocker_screened: false`."""
    config = dict(payload.get("config", {}))
    config.setdefault("blocker_screened", False)
    return {**payload, "config": config}


def _v1_gate(payload: dict[str, Any]) -> dict[str, Any]:
    """GateDecided v2 adds the robust rules' verdicts; a v1 decision was the strict rule's alone."""
    return payload


UPCASTERS: dict[tuple[str, int], Upcaster] = {
    ("RunStarted", 1): _v1_config,
    ("RunForked", 1): _v1_config,
    ("RunStarted", 2): _v2_config,
    ("RunForked", 2): _v2_config,
    ("RunStarted", 3): _v3_config,
    ("RunForked", 3): _v3_config,
    ("RunStarted", 4): _v4_started,
    ("RunStarted", 5): _v5_config,
    ("RunForked", 4): _v5_config,
    ("RunStarted", 6): _v6_config,
    ("RunForked", 5): _v6_config,
    ("RunStarted", 7): _v7_front_matter,
    ("RunStarted", 8): _v8_distractors,
    ("RunStarted", 9): _v9_train_files,
    ("RunForked", 7): _v9_train_files,
    ("RunForked", 6): _v7_front_matter,
    ("RunStarted", 10): _v10_bank,
    ("RunForked", 8): _v10_bank,
    ("RunStarted", 11): _v11_selection,
    ("RunForked", 9): _v11_selection,
    ("RunStarted", 12): _v12_ablation,
    ("RunForked", 10): _v12_ablation,
    ("RunStarted", 13): _v13_screen,
    ("RunForked", 11): _v13_screen,
    ("RunStarted", 14): _v14_screen_and_ablation,
    ("RunForked", 12): _v14_screen_and_ablation,
    ("RunStarted", 15): _v15_screened,
    ("RunForked", 13): _v15_screened,
    ("GateDecided", 1): _v1_gate,
}


class UnknownEventError(CorruptLogError, ValueError):
    """An event type or version this skillstate cannot read."""


def register(cls: type[Event]) -> type[Event]:
    """Register an event class (used by extensions and tests)."""
    EVENT_TYPES[cls.type] = cls
    return cls


def decode(type_name: str, version: int, payload: dict[str, Any]) -> Event:
    """Build the current version of an event from a stored payload."""
    cls = EVENT_TYPES.get(type_name)
    if cls is None:
        raise UnknownEventError(f"unknown event type {type_name!r}")
    if version > cls.version:
        raise UnknownEventError(f"{type_name} v{version} is newer than this skillstate (v{cls.version})")
    while version < cls.version:
        upcast = UPCASTERS.get((type_name, version))
        if upcast is None:
            raise UnknownEventError(f"no upcaster for {type_name} v{version}")
        payload = upcast(payload)
        version += 1
    return cls.model_validate(payload)


class UnencodableEventError(InternalError, ValueError):
    """An event holding a value its stored JSON could not hold (NaN, an
    infinity): refused before it is appended, so the log stays readable."""


def unfit_for_json(value: Any, path: str = "") -> tuple[str, Any] | None:
    """(where, what) of the first value in `value` that strict JSON cannot
    hold: a non-finite number, or an object that is not a dict, list, str,
    number, bool or None; None when there is none."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path or "value", value)
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not (key is None or isinstance(key, (str, int)) or (isinstance(key, float) and math.isfinite(key))):
                return (f"{path}[{key!r}]" if path else repr(key)), key  # (json writes these keys as strings)
            found = unfit_for_json(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = unfit_for_json(item, f"{path}[{i}]")
            if found:
                return found
        return None
    return (path or "value"), value


# canonical_json's writer, refusing a non-finite number instead of writing it
_STRICT_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_json(event: Event) -> str:
    """The stored payload of `event` as its canonical JSON (what
    `canonical_json(encode(event))` gives), checked by the JSON writer as it
    writes: a payload it refuses is looked over by `encode`, which names
    the value at fault."""
    try:
        return _STRICT_JSON.encode(event.model_dump(mode="json"))
    except (ValueError, TypeError):
        encode(event)  # raises UnencodableEventError, saying where
        raise


def encode(event: Event) -> dict[str, Any]:
    """The stored payload of `event`. A value strict JSON cannot hold (NaN,
    an infinity) is refused here, so no event that cannot be read back is
    ever appended."""
    payload = event.model_dump(mode="json")
    found = unfit_for_json(payload)
    if found is not None:
        where, value = found
        raise UnencodableEventError(f"{event.type}: {where} is {value!r}, which the log cannot store "
                                    "(numbers must be finite); nothing was appended")
    return payload
