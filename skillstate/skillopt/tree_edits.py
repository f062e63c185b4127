"""Edits across the files of a skill directory. Pure and deterministic.

A run that trains a whole Agent Skills directory (`train_files: all`) takes edits that name a
file (`Edit.file`; "" or `SKILL.md` is SKILL.md). Edits of SKILL.md go through the one-file
editor as before, with its front matter and slow-update block protected. An edit of another
file applies the same ops (`append`, `insert_after`, `replace`, `delete`) to that file's text.
Two ops change the tree itself:
- `create`: a new file at `file`, whose text is `content`;
- `remove`: the file at `file` goes.

Both work only under `references/`, so SKILL.md, scripts and assets are never created or
removed. Paths are confined by `skilltree.paths` (no `..`, no absolute path); a binary file
and an executable one (a script the user runs, which no rollout measures) are never edited, and a
NUL character a model writes is dropped (no text file holds one). An edit that names a path it
cannot use is skipped, with its reason in the apply report, and the screen drops it before
selection.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from skillstate.errors import UserError
from skillstate.log.values import ApplyEntry, DroppedEdit, Edit
from skillstate.skillopt.editor import CHANGED, OPS, apply_edit
from skillstate.skilltree.bundle import bundle, is_bundle, unbundle, view
from skillstate.skilltree.paths import check_path
from skillstate.skilltree.skill_md import skill_md_path
from skillstate.skilltree.tree import SKILL_MD, SkillTree

CREATE, REMOVE = "create", "remove"
FILE_OPS = (CREATE, REMOVE)
REFERENCES = "references/"

PatchMd = Callable[[str, list[Edit]], tuple[str, list[ApplyEntry], bool]]


def is_skill_md_edit(edit: Edit) -> bool:
    """Whether the edit is for SKILL.md: no file, or a path that is SKILL.md once normalized (a lookalike
    such as a Kelvin sign for the K stands for it too, so it cannot slip past SKILL.md's protections)."""
    raw = edit.file.strip().removeprefix("./")
    return raw == "" or edit_path(edit) in (SKILL_MD, "skill.md")


def text_of(text: str) -> str:
    """`text` as a text file may hold it: a NUL character a model wrote is dropped."""
    return text.replace("\x00", "")


def edit_path(edit: Edit) -> str | None:
    """The stored path an edit of another file names, or None when it is not a path a skill may hold."""
    try:
        return check_path(edit.file.strip().removeprefix("./"))
    except UserError:
        return None


def file_problem(tree: SkillTree, edit: Edit) -> str | None:
    """Why an edit of a file other than SKILL.md cannot apply to `tree` (None when it can)."""
    path = edit_path(edit)
    if path is None:
        return "bad_path"
    if edit.op in FILE_OPS:
        if not path.startswith(REFERENCES) or path == REFERENCES:
            return "outside_references"
        if edit.op == CREATE:
            if path in tree:
                return "file_exists"
            if not text_of(edit.content).strip():
                return "empty_content"
            try:
                tree.with_text(path, text_of(edit.content))
            except UserError:
                return "bad_path"
            return None
        return None if path in tree else "no_such_file"
    if path not in tree:
        return "no_such_file"
    if tree[path].is_binary:
        return "binary_file"
    if tree[path].executable:  # a script: code the user runs, which no rollout measures
        return "executable_file"
    if edit.op not in OPS:
        return "unknown_op"
    return None


def apply_file_edit(tree: SkillTree, edit: Edit) -> tuple[SkillTree, str]:
    """One edit of a file other than SKILL.md: (the tree after it, its status)."""
    problem = file_problem(tree, edit)
    if problem is not None:
        return tree, f"skipped_{problem}"
    path = edit_path(edit)
    assert path is not None
    if edit.op == CREATE:
        return tree.with_text(path, text_of(edit.content)), "applied"
    if edit.op == REMOVE:
        return tree.without(path), "applied"
    text, status = apply_edit(tree[path].text, _without_nul(edit))
    return (tree.with_text(path, text) if status in CHANGED else tree), status


def _without_nul(edit: Edit) -> Edit:
    if "\x00" not in edit.content and "\x00" not in edit.target:
        return edit
    return edit.model_copy(update={"content": text_of(edit.content), "target": text_of(edit.target)})


def patch_tree(tree: SkillTree, edits: Sequence[Edit], patch_md: PatchMd) -> tuple[SkillTree, list[ApplyEntry], bool]:
    """Apply `edits` across `tree`: SKILL.md's through `patch_md` (the one-file patch, with its
    protections), the others in order. Returns (the tree, the apply report in the edits' order,
    whether SKILL.md's edits wrote what had to be removed)."""
    md_path = skill_md_path(tree)
    md_at = [i for i, e in enumerate(edits) if is_skill_md_edit(e)]
    report: dict[int, ApplyEntry] = {}
    restored = False
    if md_at:
        text, md_report, restored = patch_md(tree[md_path].text, [_without_nul(edits[i]) for i in md_at])
        report.update((md_at[r.index], r) for r in md_report)
        if any(r.status in CHANGED for r in md_report):
            tree = tree.with_text(md_path, text_of(text))
    for i, edit in enumerate(edits):
        if i not in report:
            tree, status = apply_file_edit(tree, edit)
            report[i] = ApplyEntry(index=i, op=edit.op, status=status)
    return tree, [report[i].model_copy(update={"index": i}) for i in range(len(edits))], restored


def screen_file_edits(tree: SkillTree, edits: Sequence[Edit],
                      indices: Sequence[int]) -> tuple[list[int], list[DroppedEdit]]:
    """The edits at `indices` (all of other files than SKILL.md) that would change the tree, each
    alone: (kept, dropped with the reason: the file problem, `no_change`, or `duplicate`)."""
    kept: list[int] = []
    dropped: list[DroppedEdit] = []
    seen: set[tuple[str, str, str, str]] = set()
    for i in indices:
        edit = edits[i]
        key = (edit_path(edit) or edit.file, edit.op, edit.target.strip(), edit.content.strip())
        after, status = apply_file_edit(tree, edit)
        reason = status.removeprefix("skipped_") if status.startswith("skipped_") else (
            "no_change" if status not in CHANGED else "duplicate" if key in seen else None)
        if reason is None:
            seen.add(key)
            kept.append(i)
        else:
            dropped.append(DroppedEdit(index=i, reason=reason))
    return kept, dropped


def md_of(skill: str) -> str:
    """SKILL.md's text of a skill as stages hold it (a bundle), or the markdown skill itself."""
    if not is_bundle(skill):
        return skill
    tree = unbundle(skill)
    return tree[skill_md_path(tree)].text


def with_md(skill: str, md: str) -> str:
    """`skill` with SKILL.md's text set to `md` (a bundle stays a bundle with its other files; a markdown
    skill is `md`)."""
    if not is_bundle(skill):
        return md
    tree = unbundle(skill)
    return bundle(tree.with_text(skill_md_path(tree), text_of(md)))


def shown(skill: str, whole: bool = True) -> str:
    """A skill as a prompt shows it: a bundle as its view (every file in a block), or with `whole` off
    (the rewrite modes, which rewrite SKILL.md alone) as SKILL.md's text; markdown as it is."""
    if not is_bundle(skill):
        return skill
    return view(unbundle(skill)) if whole else md_of(skill)
