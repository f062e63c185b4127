"""A run's skill as an Agent Skill that installs as is: the directory the run
started from (RunStarted.skill_tree) with its SKILL.md as trained (or the trained
directory itself, `train_files`), or, for a
run of a markdown file that opens with a valid front matter, that one file."""

from __future__ import annotations

from skillstate.engine.loading import LoadedRun, load_run
from skillstate.errors import UserError
from skillstate.reading.history import chosen_skill
from skillstate.skilltree import SkillTree, decode_tree, from_markdown, is_tree_blob, validate_skill, with_skill_md
from skillstate.storage.store import Store


def installable_skills(store: Store, run_id: str | None, step: int | None = None,
                       best: bool = False) -> tuple[str, list[tuple[str, SkillTree]]]:
    """(run id, [(name, tree)]) of the skill `reading.history.skill_at`
    picks: for a bank run (mode bank) one Agent Skill per bank skill
    (`bank.agent_skills`), else the one `installable_skill` gives."""
    loaded = load_run(store, run_id)
    text = store.get_blob(chosen_skill(loaded, step, best))
    if loaded.state.config.get("mode") != "bank":
        tree, name = _installable(store, loaded, text)
        return loaded.run_id, [(name, tree)]
    from skillstate.bank.agent_skills import bank_skill_trees
    from skillstate.bank.document import read_bank

    skills = bank_skill_trees(read_bank(text))
    if not skills:
        raise UserError(f"the bank of run {loaded.run_id!r} holds no skill to install")
    return loaded.run_id, skills


def installable_skill(store: Store, run_id: str | None, step: int | None = None,
                      best: bool = False) -> tuple[str, SkillTree, str]:
    """(run id, tree, skill name) of the skill `reading.history.skill_at`
    picks. `UserError` in one line when it cannot be installed: a markdown
    skill without a name and a description, or a trained SKILL.md that no
    longer passes the Agent Skills checks."""
    loaded = load_run(store, run_id)
    tree, name = _installable(store, loaded, store.get_blob(chosen_skill(loaded, step, best)))
    return loaded.run_id, tree, name


def _installable(store: Store, loaded: LoadedRun, text: str) -> tuple[SkillTree, str]:
    root = loaded.state.skill_tree
    if is_tree_blob(text):  # the run trained the whole directory: the skill is the tree
        tree = decode_tree(text, store.get_blobs)
    else:
        tree = with_skill_md(decode_tree(store.get_blob(root), store.get_blobs), text) if root else from_markdown(text)
    report = validate_skill(tree, None)
    if root is None and report.name is None:
        raise UserError(f"run {loaded.run_id!r} trained a markdown skill with no front matter (name, description), "
                        "which an agent cannot install: export it as markdown, or train a skill directory")
    try:
        report.raise_if_invalid()
    except UserError as err:
        raise UserError(f"the skill of run {loaded.run_id!r} is not a valid Agent Skill: {err}") from None
    assert report.name is not None  # a valid Agent Skill has one
    return tree, report.name
