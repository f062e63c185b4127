"""How well a skill triggers, with progressive disclosure (`disclosure: tools`).

Each rollout records the installed skills the target loaded. An item expects
the trained skill, unless it names another in `expected_skill` (a distractor's
name, or "" for none). Over a set of rollouts:
- recall: the share of rollouts expecting a skill in which the target loaded it;
- precision: the share of all skill loads that were of the skill the rollout
  expected (a distractor loaded beside the trained one, or instead of it, is a
  false load);
- wrong loads: the rollouts that loaded any skill they did not expect;
- by task type: the recall of each type; and how often each file was read.

An external agent (env workspace with a harness other than builtin: Codex, Claude
Code, a program of yours) reads its installed skills as files, with its own
tools; the run does not see which files it opens, so its loads are not
observed and no rate is computed for it (`unobserved_loads` names the harness).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from skillstate.log.state import RunState
from skillstate.storage.store import Store


def trigger_rates(results: list[dict[str, Any]], items: dict[str, dict[str, Any]], trained: str) -> dict[str, Any]:
    """The rates of a list of stored ItemResult dicts (see the module's doc)."""
    expecting = hits = loads = right_loads = wrong = 0
    by_type: dict[str, list[int]] = {}
    files: Counter[str] = Counter()
    for result in results:
        item = items.get(result["item_id"], {})
        expected = item.get("expected_skill", trained)
        loaded = list(result.get("skills_loaded") or [])
        loads += len(loaded)
        right_loads += expected in loaded if expected else 0
        wrong += any(name != expected for name in loaded)
        files.update(result.get("files_read") or [])
        if expected:
            expecting += 1
            hits += expected in loaded
            row = by_type.setdefault(result.get("task_type", ""), [0, 0])
            row[0] += expected in loaded
            row[1] += 1
    return {"rollouts": len(results), "recall": hits / expecting if expecting else None,
            "precision": right_loads / loads if loads else None, "loads": loads, "wrong_loads": wrong,
            "by_task_type": {t: n / d for t, (n, d) in sorted(by_type.items())},
            "files_read": dict(sorted(files.items()))}


def _name_of(skill_md: str) -> str:
    from skillstate.skilltree.frontmatter import front_matter_or_none

    front = front_matter_or_none(skill_md)
    return str(front.fields.get("name", "")) if front is not None else ""


def unobserved_loads(config: Any) -> str | None:
    """The harness of a `disclosure: tools` run whose skill loads are not observed (an external agent's, which
    reads its skills as files); None for a run whose loads are recorded."""
    if config.get("disclosure") != "tools" or config.get("env") != "workspace":
        return None
    harness = (config.get("env_config") or {}).get("harness") or {}
    kind = harness.get("kind", "builtin") if isinstance(harness, dict) else "builtin"
    return None if kind == "builtin" else str(kind)


def run_triggers(store: Store, state: RunState, events: Iterable[Any]) -> dict[str, Any] | None:
    """The trigger rates of a `disclosure: tools` run's evaluations, from its
    lineage's `events` (stored events): the initial skill on val (`baseline`)
    and each test evaluation (`test_baseline`, `test_best`); None for a run
    that is not one, or whose loads are not observed (`unobserved_loads`)."""
    if state.config.get("disclosure") != "tools" or unobserved_loads(state.config):
        return None
    from skillstate.log.events import BaselineEvaluated
    from skillstate.reading.skill_text import skill_md_of

    items = {item["id"]: item for info in state.dataset.values() for item in json.loads(store.get_blob(info["hash"]))}
    evaluated: list[tuple[str, str, str, str]] = []  # (label, split, skill blob, results blob)
    for stored in events:
        if isinstance(stored.event, BaselineEvaluated):
            evaluated.append(("baseline", stored.event.split, stored.event.skill, stored.event.results))
    for label, event in sorted(state.tests.items()):
        evaluated.append((f"test_{label}", event.split, event.skill, event.results))
    out: dict[str, Any] = {}
    for label, split, skill, results in evaluated:
        rates = trigger_rates(json.loads(store.get_blob(results)), items, _name_of(skill_md_of(store, skill)))
        out[label] = {"split": split, **rates}
    return out
