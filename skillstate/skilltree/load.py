"""One entry point for a skill given by path: a directory, a `.zip`/`.skill` archive, or a
markdown file (the one-file case; a file named SKILL.md stands for its whole directory)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from skillstate.errors import UserError
from skillstate.skilltree.archive import is_archive_path, read_archive
from skillstate.skilltree.disk import read_directory
from skillstate.skilltree.limits import DEFAULT_LIMITS, Limits, read_bounded
from skillstate.skilltree.onefile import from_markdown
from skillstate.skilltree.tree import SKILL_MD, SkillTree

Source = Literal["directory", "archive", "markdown"]


@dataclass(frozen=True)
class LoadedSkill:
    """A skill read from `path`: its tree, the name of the directory that held it (None for a lone
    markdown file or an archive with SKILL.md at its top), and what kind of source it was."""

    tree: SkillTree
    dir_name: str | None
    source: Source
    path: str


def load_skill(path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS) -> LoadedSkill:
    """Read the skill at `path`; `UserError` in one line naming the path when it cannot."""
    given = Path(path)
    if not given.exists():
        raise UserError(f"{given}: no such file or directory")
    if given.is_dir():
        return LoadedSkill(read_directory(given, limits), _dir_name(given), "directory", str(given))
    if given.name in (SKILL_MD, "skill.md"):
        directory = given.parent
        return LoadedSkill(read_directory(directory, limits), _dir_name(directory), "directory", str(directory))
    if is_archive_path(given):
        tree, top = read_archive(given, limits)
        return LoadedSkill(tree, top, "archive", str(given))
    return LoadedSkill(from_markdown(read_markdown(given, limits)), None, "markdown", str(given))


def read_markdown(path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS) -> str:
    """The text of a markdown skill file, exactly (no newline translation)."""
    given = Path(path)
    data = read_bounded(given, limits.max_file_bytes, "a skill file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{given}: not UTF-8 text (a markdown skill, or a .zip/.skill archive, was expected)") from None
    if "\x00" in text:
        raise UserError(f"{given}: holds a NUL character, so it is not a markdown skill")
    return text


MARKDOWN_SUFFIXES = (".md", ".markdown")


def not_a_markdown_skill(loaded: LoadedSkill) -> str | None:
    """Why a lone file `load_skill` read as a one-file markdown skill is not one (None when it may be): its name
    does not end in .md or .markdown, or its text is JSON (a data file). `skill check` refuses such a file rather
    than call it "a plain markdown skill"; a run's `initial_skill` still takes any text file."""
    if loaded.source != "markdown":
        return None
    path = Path(loaded.path)
    if path.suffix.lower() not in MARKDOWN_SUFFIXES:
        return (f"{path}: not a skill: give a skill directory (or its SKILL.md), a .skill or .zip archive, or a "
                f"markdown file (.md)")
    text = next(iter(loaded.tree.values())).text.strip()
    if text[:1] in ("{", "["):
        import json

        try:
            for line in [text] if text[:1] == "[" else text.splitlines():
                if line.strip():
                    json.loads(line)
        except ValueError:
            return None
        return f"{path}: holds JSON, not a markdown skill"
    return None


def _dir_name(directory: Path) -> str:
    """The name an agent sees: that of the path given (a link's own name, not its target's)."""
    return Path(os.path.abspath(directory)).name
