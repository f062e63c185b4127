"""What the simulated analyst proposes beyond a rule for SKILL.md: in a run that trains a skill directory, a
rule put in the reference SKILL.md points to (or in a new one, with a pointer), a rule moved out of SKILL.md
into a reference of its own, and, with progressive disclosure, a description that names the kinds of question
the target did not load the skill for. `skillstate.sim.optimizer` calls these."""

from __future__ import annotations

from collections import Counter
from typing import Any

from skillstate.sim.disclosure import hits, to_read, topic, triggers
from skillstate.skilltree.frontmatter import front_matter_or_none
from skillstate.skilltree.tree import SKILL_MD


def file_edits(world: Any, files: dict[str, str], task_type: str, rng) -> list[dict[str, str]] | None:
    """A run that trains a skill directory: the rule a failing kind lacks, put in the reference SKILL.md
    points to for that kind (or now and then a rule that does not help), or in a new reference with a
    pointer to it; None: propose for SKILL.md as usual."""
    rule = world.rule_for(task_type)
    if rule.key in "\n".join(files.values()).lower():
        return None
    md = files.get(SKILL_MD, "")
    pointed = [p for p in to_read(md, task_type) if p in files and not p.startswith("scripts/")]
    roll = rng.random()
    if pointed and roll < 0.6:
        text = rng.choice(rule.variants) if rng.random() < 0.65 else rng.choice(world.useless)
        return [{"op": "append", "target": "", "content": f"- {text}", "file": pointed[0]}]
    path = f"references/{task_type or 'general'}.md"
    if not pointed and roll < 0.35 and path not in files:
        name = topic(task_type)
        pointer = f"- {name[0].upper()}{name[1:]} questions: follow [{path}]({path})."
        at = "## Where to look" if "## Where to look" in md else "## Rules" if "## Rules" in md else ""
        return [{"op": "create", "target": "", "content": f"# {name.title()}\n\n- {rng.choice(rule.variants)}\n",
                 "file": path},
                {"op": "insert_after" if at else "append", "target": at, "content": pointer}]
    return None


def move_out(world: Any, files: dict[str, str]) -> list[dict[str, str]]:
    """A rule for one kind of question moved out of SKILL.md into a new reference, with a pointer that names
    the kind (the target then reads it only for that kind); [] when no rule line can move."""
    md = files.get(SKILL_MD, "")
    types = sorted({str(item.get("task_type", "")) for item in getattr(world, "items", {}).values()} - {""})
    for task_type in types:
        key, path = world.rule_for(task_type).key, f"references/{task_type}.md"
        line = next((ln for ln in md.splitlines() if ln.startswith("- ") and key in ln.lower()), None)
        if line is None or path in files or to_read(md, task_type):
            continue
        name = topic(task_type)
        at = "## Where to look" if "## Where to look" in md else ""
        return [{"op": "create", "target": "", "content": f"# {name.title()}\n\n{line}\n", "file": path},
                {"op": "delete", "target": line, "content": ""},
                {"op": "insert_after" if at else "append", "target": at,
                 "content": f"- {name[0].upper()}{name[1:]} questions: follow [{path}]({path})."}]
    return []


def describe_edit(world: Any, prompt: str, skill: str, failures: list[dict], rng) -> dict[str, str] | None:
    """With progressive disclosure (the prompt offers `describe`): a description that also names the kinds of
    failed question the target did not load the skill for; None when it loaded it for all of them."""
    if "`describe`" not in prompt or rng.random() < 0.15:
        return None
    parsed = front_matter_or_none(skill)
    front = dict(parsed.fields) if parsed is not None else {}
    if not isinstance(front.get("description"), str):
        return None
    name, old = front.get("name"), str(front["description"]).strip()
    own = getattr(world, "describe", None)  # a world that words descriptions its own way (env evals)
    if own is not None:
        text = own(old, [f for f in failures if isinstance(f, dict) and isinstance(f.get("skills_loaded"), list)
                         and name not in f["skills_loaded"]])
        return {"op": "describe", "target": "", "content": text} if text and len(text) <= 1024 else None
    missed = Counter(str(f.get("task_type", "")) for f in failures if isinstance(f, dict)
                     and isinstance(f.get("skills_loaded"), list) and name not in f["skills_loaded"])
    kinds = [t for t, _n in sorted(missed.items(), key=lambda kv: (-kv[1], kv[0]))
             if hits(old, t) < len(triggers(t))][:2]
    if not kinds:
        return None
    new = f"{old.rstrip('. ')}; also {' and '.join(topic(t) for t in kinds)} questions."
    return {"op": "describe", "target": "", "content": new} if len(new) <= 1024 else None
