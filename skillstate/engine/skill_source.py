"""Where a run's initial skill comes from: a markdown file, as always, or an
Agent Skills directory or `.zip`/`.skill` archive.

A run of a directory trains its `SKILL.md`: the text the target is shown and
the optimizer edits is that file, whole, and its front matter is protected
as the slow update's block is (`skillopt.guidance`). The directory itself
(the references, scripts and assets beside `SKILL.md`) is recorded once, in
`RunStarted`, as a tree blob and its file blobs, so that `export` can write
the trained skill back as a directory or an archive that installs as is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from skillstate.errors import ConfigError, UserError
from skillstate.input_files import read_input_text
from skillstate.skilltree import SKILL_MD, EncodedTree, SkillReport, encode_tree, load_skill, validate_skill
from skillstate.skilltree.archive import is_archive_path
from skillstate.skilltree.frontmatter import parse_front_matter
from skillstate.skilltree.skill_md import skill_md_path

# Files a skill directory should never carry into a run's log: credentials and private keys.
_SECRET_NAMES = {".env", ".netrc", ".npmrc", ".pypirc", ".git-credentials", "credentials", "credentials.json",
                 "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519"}
_SECRET_SUFFIXES = (".pem", ".key", ".p12", ".pfx")


def looks_like_secrets(path: str) -> bool:
    """Whether a skill's file at `path` is by its name a credentials or private-key file."""
    name = path.rsplit("/", 1)[-1].lower()
    return name in _SECRET_NAMES or name.startswith(".env.") or name.endswith(_SECRET_SUFFIXES)


@dataclass(frozen=True)
class InitialSkill:
    """The text the run trains, and for a directory or an archive its tree
    (`encoded`, the blobs to store) and the checks it passed (`report`,
    whose warnings the caller may show)."""

    text: str
    encoded: EncodedTree | None = None
    report: SkillReport | None = None


def is_skill_tree_path(path: str | Path) -> bool:
    """Whether `path` names an Agent Skills directory, an archive, or the
    SKILL.md of a skill directory: a file named exactly SKILL.md that opens
    with a front matter (its directory is then checked as a skill, so a
    `name` that is not the directory's is refused, not trained alone). Any
    other file is a markdown skill, as it always was (a `skill.md`, or a
    SKILL.md without a front matter, trains alone)."""
    given = Path(path).expanduser()
    if given.is_dir() or is_archive_path(given):
        return True
    if given.name != SKILL_MD:
        return False
    try:
        front = parse_front_matter(read_input_text(given))
    except (OSError, UnicodeDecodeError, UserError):
        return False  # read as markdown, which says what is wrong with it
    return front is not None


def read_initial_skill(path: str, secrets: Sequence[str] = ()) -> InitialSkill:
    """The skill at `path`. A markdown file is read as it always was; a
    directory (or its SKILL.md) or an archive must be a valid Agent Skill,
    and hold no credentials file and no file containing one of `secrets`
    (the run's API keys): `ConfigError` in one line naming the first
    problem."""
    if not is_skill_tree_path(path):
        try:
            return InitialSkill(read_input_text(path))
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"cannot read initial skill {path}: {getattr(err, 'strerror', None) or err}") from None
    try:
        loaded = load_skill(Path(path).expanduser())
        report = validate_skill(loaded.tree, loaded.dir_name)
        report.raise_if_invalid()
    except UserError as err:
        raise ConfigError(f"initial skill {path}: {err}") from None
    keys = [k for k in secrets if len(k) >= 8]
    secret = next((p for p in loaded.tree if looks_like_secrets(p)), None) or next(
        (p for p, f in loaded.tree.items() if keys and any(k.encode() in f.data for k in keys)), None)
    if secret is not None:
        raise ConfigError(f"initial skill {path}: {secret} holds or looks like a secret (a credentials or key "
                          "file, or the API key the run is given), and a run stores every file of the skill in its "
                          "log: take it out of the skill")
    return InitialSkill(loaded.tree[skill_md_path(loaded.tree)].text, encode_tree(loaded.tree), report)
