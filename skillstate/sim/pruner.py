"""The simulated optimizer's answer to the `prune` prompt: which lines of the
skill to delete. Like a fallible LLM it spots most restatements of a rule
the skill already has (the later ones), most lines that do nothing and some
that hurt; in the noisy mode (`sim.harmful_edits`) it now and then also
names a rule the skill needs, the only line that states it. A line that
blocks another task type (`sim.blocking`) reads as a style rule: it names
it less often."""

from __future__ import annotations

import json
import re
from typing import Any

from skillstate.sim.blockers import SPOT_BY_PRUNER
from skillstate.sim.noise import OFF, SimNoise

SPOT = 0.8  # the chance of naming a line that does not earn its place
SPOT_HARM = 0.5  # ... and one that hurts (it shows as a rule like the others)


def max_lines(prompt: str) -> int:
    match = re.search(r"Delete at most (\d+) lines", prompt)
    return int(match.group(1)) if match else 5


def prune_reply(world: Any, skill: str, limit: int, rng, noise: SimNoise = OFF, rejected: list | None = None) -> str:
    """The reply: lines to delete, none of `rejected` (deletions the gate turned down before)."""
    if rng.random() < 0.06:
        return "The skill looks lean already; I would keep it as it is."
    keys = world.all_rule_keys()
    traps = [t.key for t in getattr(world, "cross_harms", ())] + [h.key for h in world.harms]
    broad = [b.key for b in getattr(world, "blockers", ())]
    useless = {u.lower() for u in world.useless}
    seen: set[str] = set()
    delete: list[str] = []
    sole: list[str] = []
    for line in skill.splitlines():
        low = line.lower()
        text = line.strip().lstrip("-*+ ").strip().lower()
        if not text or line.lstrip().startswith(("#", "<!--")):
            continue
        if broad and any(k in low for k in broad):
            if rng.random() < SPOT_BY_PRUNER:
                delete.append(line)
            continue
        if any(k in low for k in traps):
            if rng.random() < SPOT_HARM:
                delete.append(line)
            continue
        key = next((k for k in keys if k in low), None)
        if key is not None:
            if key in seen:
                if rng.random() < SPOT:
                    delete.append(line)
            else:
                seen.add(key)
                sole.append(line)
            continue
        if text in useless and rng.random() < SPOT:
            delete.append(line)
    if noise.harmful_edits and sole and rng.random() < noise.harmful_edits:
        delete.append(rng.choice(sole))  # a mistake: the rule looked redundant
    delete = [line for line in delete if line not in (rejected or [])][:limit]
    return json.dumps({"reasoning": f"{len(delete)} line(s) repeat a rule or add nothing.", "delete": delete})
