"""Select and Update: the learning rate (fixed schedule or chosen by the
optimizer), the ranking of edits, and building the candidate skill by
patching, rewriting or taking the merged full rewrite. The slow-update block
is protected in code here, whatever the edits or the rewrite did."""

from __future__ import annotations

import json
from typing import Any

from skillstate.engine.context import RunContext
from skillstate.engine.parsing import RankReply, SkillReply, extract_json, parse_reply
from skillstate.engine.prompting import compose, edits_json, to_json
from skillstate.log.events import ApplyEntry, CandidateBuilt, Edit, EditsSelected, Event, LearningRateChosen
from skillstate.log.events_screen import EditsScreened
from skillstate.log.reducer import RunState, need, step_progress
from skillstate.log.values import DroppedEdit
from skillstate.skillopt.describe import DESCRIBE, apply_describe
from skillstate.skillopt.editor import CHANGED, apply_edits
from skillstate.skillopt.guidance import body_of, front_of, guidance_of, protect, with_guidance
from skillstate.skillopt.linked_pairs import keep_links_whole
from skillstate.skillopt.minibatch import ranked
from skillstate.skillopt.scheduler import clamp_edit_count
from skillstate.skillopt.screen import edit_key, normalized_counts, screen_describes, screen_edits
from skillstate.skillopt.tree_edits import is_skill_md_edit, md_of, patch_tree, screen_file_edits, with_md
from skillstate.skilltree.bundle import bundle, is_bundle, unbundle
from skillstate.skilltree.tree import SkillTree


def fallback_order(edits: list[Edit]) -> list[int]:
    """Failure edits first, then by support, then by position."""
    return sorted(range(len(edits)), key=lambda i: (edits[i].source != "failure", -edits[i].support, i))


def choose_learning_rate(ctx: RunContext, state: RunState) -> list[Event]:
    """lr_control autonomous: one call decides how many edits to apply."""
    p = step_progress(state)
    edits = need(p.merged, "PatchesMerged").edits
    results = need(p.rollout, "RolloutCompleted").results
    batch = {
        "items": len(results), "solved": sum(1 for r in results if r.hard >= 1),
        "hard": round(sum(r.hard for r in results) / len(results), 4) if results else 0.0,
        "soft": round(sum(r.soft for r in results) / len(results), 4) if results else 0.0,
        "current_score": state.current_score, "best_score": state.best_score,
        "scheduler_budget": p.edit_budget,
    }
    result = ctx.optimizer(compose(ctx, state, "learning_rate", buffer=True, skill=ctx.skill(p.base_skill),
                                   batch=to_json(batch), edits=to_json(edits_json(edits, with_index=True)),
                                   candidates=len(edits)))
    common: dict[str, Any] = dict(step=p.step, candidates=len(edits), call=result.ref)
    if not result.ok:
        return [LearningRateChosen(status="error", chosen=0, reasoning=result.error or "", **common)]
    data = extract_json(result.text)
    if data is None or "num_edits" not in data:
        return [LearningRateChosen(status="unparseable", chosen=0, **common)]
    raw = data["num_edits"]
    chosen = clamp_edit_count(raw, len(edits))
    reasoning = data.get("reasoning") if isinstance(data.get("reasoning"), str) else ""
    return [LearningRateChosen(status="ok", requested=json.dumps(raw), chosen=chosen, reasoning=reasoning, **common)]


def select(ctx: RunContext, state: RunState) -> list[Event]:
    """Keep at most the budget of the merged edits, after dropping those that
    would change nothing (`skillstate.skillopt.screen`): ranked by the optimizer when
    more are left than the budget allows."""
    p = step_progress(state)
    edits = need(p.merged, "PatchesMerged").edits
    base = ctx.skill(p.base_skill)
    kept, dropped = screen(ctx.config, state, base, edits)
    return [links_whole(ctx.config, base, edits, kept, chosen(ctx, state, base, edits, kept, dropped))]


def links_whole(config: Any, base: str, edits: list[Edit], kept: list[int], selected: EditsSelected) -> EditsSelected:
    """The selection with its links kept whole (`skillstate.skillopt.linked_pairs`): in a run that trains a
    directory, a link to a file the selection would leave out brings in the edit that creates it (`paired`),
    or the edit that writes the link (or removes its file) is dropped as `dangling_link`."""
    if not config.keep_links_whole or not is_bundle(base) or not selected.edits or config.update_mode != "patch":
        return selected
    tree = unbundle(base)

    def build(chosen: list[Edit]) -> SkillTree:
        return unbundle(patch_with(config, base, chosen)[0])

    out = {d.index for d in selected.dropped}  # e.g. screened out: no pair brings those back
    settled = keep_links_whole(tree, edits, selected.selected_indices, [i for i in kept if i not in out], build)
    if settled.selected == selected.selected_indices:
        return selected
    return selected.model_copy(update=dict(
        selected_indices=settled.selected, edits=[edits[i] for i in settled.selected], paired=settled.paired,
        dropped=sorted([*selected.dropped, *settled.dropped], key=lambda d: d.index),
        method=selected.method if settled.selected else "none"))


def chosen(ctx: RunContext, state: RunState, base: str, edits: list[Edit], kept: list[int],
           dropped: list[DroppedEdit]) -> EditsSelected:
    """The selection: every edit kept when the budget allows, else the optimizer's ranking (or the screen's
    gains, with edit_screen on; when no edit passed it, as without the screen under edit_screen_fallback
    rank)."""
    p = step_progress(state)
    budget = p.learning_rate.chosen if p.learning_rate is not None else p.edit_budget
    if p.screened is not None:  # edit_screen: the edits that passed their minibatch, by their gain; no ranking
        by_screen = selected_by_screen(p.step, edits, kept, dropped, p.screened, budget)
        if by_screen.selected_indices or not p.screened.tried or ctx.config.edit_screen_fallback != "rank":
            return by_screen  # (with none passed and fallback rank: ranked below, as without the screen)
    common: dict[str, Any] = dict(step=p.step, budget=budget, candidates=len(edits), dropped=dropped)
    if len(kept) <= budget or budget == 0:
        indices = kept[:budget]
        return EditsSelected(method="all" if budget and kept else "none", selected_indices=indices,
                             edits=[edits[i] for i in indices], **common)
    shown = [edits[i] for i in kept]  # the ranker sees only the edits left, numbered from 0
    result = ctx.optimizer(compose(ctx, state, "rank", memo=True, skill=base, budget=budget,
                                   edits=to_json(edits_json(shown, with_index=True))), reply=RankReply)
    reply = parse_reply(result.text, RankReply) if result.ok else None
    picked: list[int] = []
    if reply is not None:
        for i in reply.selected_indices:
            if 0 <= i < len(shown) and i not in picked:
                picked.append(i)
        picked = picked[:budget]
    method = "ranked"
    if not picked:
        picked, method = fallback_order(shown)[:budget], "fallback"
    indices = [kept[i] for i in picked]
    return EditsSelected(method=method, selected_indices=indices, edits=[edits[i] for i in indices],
                         call=result.ref, **common)


def selected_by_screen(step: int, edits: list[Edit], kept: list[int], dropped: list[DroppedEdit],
                       screened: EditsScreened, budget: int) -> EditsSelected:
    """The selection after the minibatch screen: of the edits kept, those that passed, the largest gain first,
    cut to the budget; the others are dropped as `screened_out`."""
    tried = {t.index: t for t in screened.tried}
    passed = [i for i in kept if i in tried and tried[i].passed]
    out = [DroppedEdit(index=i, reason="screened_out") for i in kept if i not in passed]
    indices = ranked(passed, [tried[i].gain for i in passed])[:budget]
    return EditsSelected(step=step, budget=budget, candidates=len(edits), method="screened" if indices else "none",
                         selected_indices=indices, edits=[edits[i] for i in indices],
                         dropped=sorted(dropped + out, key=lambda d: d.index))


def screen(config: Any, state: RunState, base: str, edits: list[Edit]) -> tuple[list[int], list[DroppedEdit]]:
    """The edits kept for selection and those dropped (`skillstate.skillopt.screen`): SKILL.md's edits
    against its text; in a run that trains a directory, the edits of its other files against theirs."""
    md = md_of(base)
    md_at = [i for i, e in enumerate(edits) if not is_bundle(base) or is_skill_md_edit(e)]
    md_edits = [edits[i] for i in md_at]
    describes = config.disclosure == "tools" and config.protect_front_matter
    if config.drop_noop_edits:
        kept, dropped = screen_edits(body_of(md, front_matter=config.protect_front_matter), guidance_of(md) or "",
                                     md_edits, state.rejected_edits, config.drop_rejected_edits,
                                     front_of(md) if describes else None)
    elif describes:  # one description per candidate, whatever drop_noop_edits says
        kept, dropped = screen_describes(md_edits, front_of(md))
    else:
        kept, dropped = list(range(len(md_edits))), []
    kept = [md_at[i] for i in kept]
    dropped = [d.model_copy(update={"index": md_at[d.index]}) for d in dropped]
    others = [i for i in range(len(edits)) if i not in set(md_at)]
    if others:  # edits of the directory's other files: those that cannot apply or change nothing go
        more, gone = screen_file_edits(unbundle(base), edits, others)
        if not config.drop_noop_edits:  # only what cannot apply at all
            more += [d.index for d in gone if d.reason in ("no_change", "duplicate")]
            gone = [d for d in gone if d.reason not in ("no_change", "duplicate")]
        elif config.drop_rejected_edits > 0 and state.rejected_edits:  # as for SKILL.md's edits
            counts = normalized_counts(state.rejected_edits)
            again = [i for i in more if counts.get(edit_key(edits[i]), 0) >= config.drop_rejected_edits]
            more = [i for i in more if i not in again]
            gone += [DroppedEdit(index=i, reason="rejected_before") for i in again]
        kept, dropped = sorted(kept + more), sorted(dropped + gone, key=lambda d: d.index)
    return kept, dropped


def patch_skill(base: str, edits: list[Edit], front_matter: bool = True, describe: bool = False):
    """Apply edits to the skill's body and put its front matter (with
    `front_matter`: the config's protect_front_matter) and its slow-update
    block back. With `describe` (a run whose target sees skills by their
    descriptions, `disclosure: tools`), a `describe` edit sets the front
    matter's description (`skillopt.describe`); without, it is an unknown op,
    as it always was. Returns (text, apply report, whether the edits wrote block
    markers or a front matter that had to be removed)."""
    body = body_of(base, front_matter=front_matter)
    text, report = apply_edits(body, [e for e in edits if not (describe and e.op == DESCRIBE)])
    restored = body_of(text, front_matter=front_matter) != text
    front = front_of(base) if front_matter else ""
    report = [*report]
    for index, edit in enumerate(edits):  # describe edits set the front matter's description, in order
        if describe and edit.op == DESCRIBE:
            front, status = apply_describe(front, edit.content)
            report.insert(index, ApplyEntry(index=index, op=edit.op, status=status))
    report = [r.model_copy(update={"index": i}) for i, r in enumerate(report)]
    if not any(r.status in CHANGED for r in report):
        text = body  # nothing applied: the base, in canonical form (itself when it already is)
    return with_guidance(text, guidance_of(base), front, front_matter=front_matter), report, restored


def patch_with(config: Any, base: str, edits: list[Edit]):
    """`patch_skill` as the run's config asks: its front-matter protection, and
    `describe` edits where the target chooses skills by description."""
    front, describe = config.protect_front_matter, config.disclosure == "tools"
    if not is_bundle(base):
        return patch_skill(base, edits, front, describe)
    tree, report, restored = patch_tree(unbundle(base), edits, lambda md, md_edits: patch_skill(md, md_edits, front,
                                                                                               describe))
    return bundle(tree), report, restored


def update(ctx: RunContext, state: RunState) -> list[Event]:
    p = step_progress(state)
    base = ctx.skill(p.base_skill)
    mode = ctx.config.update_mode
    protected = ctx.config.protect_front_matter
    extra: dict = {"method": mode}
    if mode == "patch":
        text, report, restored = patch_with(ctx.config, base, need(p.selected, "EditsSelected").edits)
        extra["report"] = report
    elif mode == "full_rewrite":
        text, restored = protect(md_of(base), ctx.blob(need(need(p.merged, "PatchesMerged").skill,
                                                            "the merged skill")), front_matter=protected)
        text = with_md(base, text)  # a full rewrite is of SKILL.md: the directory's other files stay
        extra["report"] = []
    else:
        suggestions = [e.content for e in need(p.selected, "EditsSelected").edits]
        body = body_of(md_of(base), front_matter=protected)  # a rewrite is of SKILL.md's body
        result = ctx.optimizer(compose(ctx, state, "rewrite", buffer=True, skill=body,
                                       suggestions=to_json(suggestions)), reply=SkillReply)
        reply = parse_reply(result.text, SkillReply) if result.ok else None
        extra.update(report=[], call=result.ref)
        if reply is None or not reply.skill.strip():
            text, restored = base, False
            extra["status"] = "error" if not result.ok else "unparseable"
        else:
            text, restored = protect(md_of(base), reply.skill, front_matter=protected)
            text = with_md(base, text)
    skill = ctx.put_skill(text)
    return [CandidateBuilt(step=p.step, base_skill=p.base_skill, skill=skill, changed=skill != p.base_skill,
                           block_restored=restored, **extra)]
