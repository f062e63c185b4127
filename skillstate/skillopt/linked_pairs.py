"""Keep a selection's links whole. Pure and deterministic.

In a run that trains a skill directory, one edit may add a link to SKILL.md (`follow
[references/dates.md]`) while another creates the file it names. Selection keeps edits one by one,
so it could keep the link and leave out the file, and the candidate would point at nothing. After
selection, each link that the selected edits leave pointing at nothing (and that the base skill did
not already have) is settled, one at a time, until none is left:

1. a selected edit that removes the linked file is dropped (`dangling_link`);
2. else, an edit that creates the file and was left out of the selection, though it passed the
   screen, joins it (`paired`): the link and its file are kept as one;
3. else, the selected edit that wrote the link is dropped (`dangling_link`).

A link the selected edits cannot be blamed for (none wrote it, none removed its file) is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from skillstate.log.values import DroppedEdit, Edit
from skillstate.skillopt.tree_edits import CREATE, REMOVE, edit_path, is_skill_md_edit
from skillstate.skilltree.links import linked_paths, missing_links
from skillstate.skilltree.skill_md import skill_md_path
from skillstate.skilltree.tree import SkillTree

DANGLING = "dangling_link"


@dataclass(frozen=True)
class Settled:
    selected: list[int]  # the selection, in order, with the paired creations after it
    paired: list[int] = field(default_factory=list)  # creations brought in for a link to them
    dropped: list[DroppedEdit] = field(default_factory=list)  # edits left out for a link to nothing


def dangling(tree: SkillTree) -> list[str]:
    """The paths SKILL.md links to that `tree` does not hold."""
    return missing_links(tree[skill_md_path(tree)].text, tree)


def keep_links_whole(base: SkillTree, edits: Sequence[Edit], selected: Sequence[int], eligible: Sequence[int],
                     build: Callable[[list[Edit]], SkillTree]) -> Settled:
    """Settle the links the edits at `selected` would leave pointing at nothing (see the module's doc).
    `eligible` are the edits that passed the screen (those a pair may bring in); `build` applies edits to
    the base skill and returns its tree."""
    chosen, paired, dropped = list(selected), [], []
    before = set(dangling(base))
    for _ in range(len(edits) + 1):
        new = [p for p in dangling(build([edits[i] for i in chosen])) if p not in before]
        if not new:
            break
        settled = False
        for path in new:
            fix = _settle(edits, chosen, eligible, path)
            if fix is None:
                before.add(path)  # not the selection's doing: leave it
                continue
            index, joins = fix
            if joins:
                chosen.append(index)
                paired.append(index)
            else:
                chosen.remove(index)
                dropped.append(DroppedEdit(index=index, reason=DANGLING))
            settled = True
            break
        if not settled:
            break
    return Settled(selected=chosen, paired=paired, dropped=sorted(dropped, key=lambda d: d.index))


def _settle(edits: Sequence[Edit], chosen: list[int], eligible: Sequence[int], path: str) -> tuple[int, bool] | None:
    """(the edit to act on, whether it joins the selection) for one link to nothing, or None."""
    for i in chosen:
        if edits[i].op == REMOVE and edit_path(edits[i]) == path:
            return i, False
    for i in eligible:
        if i not in chosen and edits[i].op == CREATE and edit_path(edits[i]) == path:
            return i, True
    for i in reversed(chosen):
        if is_skill_md_edit(edits[i]) and path in linked_paths(edits[i].content):
            return i, False
    return None
