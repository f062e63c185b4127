"""Composing optimizer prompts: the template, the step buffer and the meta
skill's memo. Everything shown comes from the folded state, so a resumed or
replayed run builds byte-identical prompts."""

from __future__ import annotations

import json
from typing import Any

from skillstate.engine.context import RunContext
from skillstate.log.reducer import RunState
from skillstate.log.values import Edit
from skillstate.prompts import render
from skillstate.skillopt.tree_edits import shown
from skillstate.skilltree.bundle import is_bundle

MEMO_HEADER = ("Memo from earlier epochs of this run, about which kinds of edits helped or hurt. "
               "It is advice for you, the optimizer; it is not part of the skill.")
# the analysts' rule for `describe` edits, where the target chooses skills by their descriptions
DESCRIBE_OP = (" The target sees this skill only by the front matter's `description` until it loads it, so a "
               "skill it does not load cannot help: `describe` replaces that description with `content` (one line, "
               "at most 1024 characters, no `target`): say what the skill does and when to use it, naming every kind "
               "of request it covers. The rest of the front matter cannot be edited.")
DESCRIBE_MERGE = (" An edit with op `describe` replaces the skill's whole description with its `content`: keep at most "
                  "one, written to cover what every describe edit asked for.")
# the analysts' rule for edits across files, where the run trains a skill directory
FILE_OP = (" This skill is a directory: each of its files is shown in a `<file path=\"...\">` block, SKILL.md "
           "first. An edit changes SKILL.md unless it names another file in `\"file\"` (its path as shown; add the "
           "key to the edit). `create` adds a file under `references/` (`file` its path, `content` its whole text) "
           "and `remove` deletes one there (`file` its path). The target reads SKILL.md when it loads the skill and "
           "another file only when SKILL.md points to it on a line that says when to read it: keep SKILL.md short, "
           "and put a long or specialised section in a reference it points to.")
FILE_ALT = "|create|remove"
FILE_MERGE = (" An edit with a `file` changes that file, and keeps it; `create` and `remove` add and delete files "
              "under `references/`.")
BUFFER_HEADER = ("Earlier steps of this epoch: what each step did and which failures it saw; rejected edits "
                 "did not improve the selection score, so do not propose them again.")


def to_json(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False)


def edits_json(edits: list[Edit], with_index: bool = False) -> list[dict[str, Any]]:
    out = []
    for i, e in enumerate(edits):
        row = {"op": e.op, "target": e.target, "content": e.content, "source": e.source, "support": e.support}
        if e.file:
            row = {"file": e.file, **row}
        out.append({"index": i, **row} if with_index else row)
    return out


def step_buffer_block(ctx: RunContext, state: RunState) -> str:
    """The step buffer as a prompt section ("" when off or empty)."""
    if not ctx.config.use_step_buffer or not state.buffer:
        return ""
    entries = [entry.to_json() for entry in state.buffer]
    return f"\n{BUFFER_HEADER}\n<previous_steps>\n{to_json(entries)}\n</previous_steps>\n"


def memo_block(ctx: RunContext, state: RunState) -> str:
    """The meta skill's memo as a preamble ("" when off or not written yet)."""
    if not ctx.config.use_meta_skill or not state.memo:
        return ""
    return f"{MEMO_HEADER}\n<optimizer_memo>\n{state.memo.strip()}\n</optimizer_memo>\n\n"


def compose(ctx: RunContext, state: RunState, name: str, *, memo: bool = False, buffer: bool = False,
            **values: Any) -> str:
    """Render prompt `name`. With `buffer` (the analysts, the learning rate,
    the rewrite call) the step buffer goes where the template has
    `$step_buffer`, or after the template when an override leaves it out;
    with `memo` (the analysts, merges and ranking) the memo is prepended."""
    template = ctx.prompts[name]
    block = step_buffer_block(ctx, state) if buffer else ""
    describes = ctx.config.disclosure == "tools"
    tree = any(isinstance(v, str) and is_bundle(v) for v in values.values())  # a run that trains a directory
    whole = ctx.config.update_mode == "patch"  # the rewrite modes rewrite SKILL.md alone
    values = {k: shown(v, whole) if isinstance(v, str) else v for k, v in values.items()}
    files = tree and whole
    values.setdefault("describe_op", (DESCRIBE_OP if describes else "") + (FILE_OP if files else ""))
    values.setdefault("describe_alt", ("|describe" if describes else "") + (FILE_ALT if files else ""))
    values.setdefault("describe_merge", (DESCRIBE_MERGE if describes else "") + (FILE_MERGE if files else ""))
    text = render(template, step_buffer=block, **values)
    if block and "$step_buffer" not in template:
        text = text.rstrip("\n") + "\n" + block
    return (memo_block(ctx, state) if memo else "") + text
