"""The skill as a tree of files: an Agent Skills directory, `SKILL.md` with its YAML
front matter beside `references/`, `scripts/` and `assets/`, as an immutable value.

It holds the tree and its files (`tree`), the confinement of their paths (`paths`), the
canonical blob encoding a run stores a tree in, with the one-file case kept a plain markdown text
(`blobs`, `onefile`), SKILL.md's front matter (`frontmatter`), reading and writing directories
and `.zip`/`.skill` archives (`disk`, `archive`, `load`, `limits`), and the checks against the
Agent Skills specification (`validate`, `links`). It may import the standard library, PyYAML,
`skillstate.errors` and `skillstate.util`, and nothing else of skillstate: the engine, the
storage, the log and the CLI build on it, never the other way round. It never prints; bad
input raises `UserError` in one line.
"""

from skillstate.skilltree.archive import archive_bytes, archive_tree, read_archive, write_archive
from skillstate.skilltree.blobs import (
    EncodedTree,
    decode_tree,
    encode_tree,
    is_tree_blob,
    tree_blob,
    tree_hash,
    tree_manifest,
)
from skillstate.skilltree.disk import read_directory, write_directory
from skillstate.skilltree.frontmatter import FrontMatter, add_front_matter, parse_front_matter, set_field
from skillstate.skilltree.limits import DEFAULT_LIMITS, Limits
from skillstate.skilltree.load import LoadedSkill, load_skill
from skillstate.skilltree.onefile import as_markdown, from_markdown, is_one_file, to_markdown
from skillstate.skilltree.paths import check_path, is_safe_path
from skillstate.skilltree.skill_md import skill_md_path, with_skill_md
from skillstate.skilltree.tree import SKILL_MD, SkillFile, SkillTree
from skillstate.skilltree.validate import Finding, SkillReport, name_problem, validate_skill

__all__ = [
    "DEFAULT_LIMITS", "SKILL_MD", "EncodedTree", "Finding", "FrontMatter", "Limits", "LoadedSkill", "SkillFile",
    "SkillReport", "SkillTree", "add_front_matter", "archive_bytes", "archive_tree", "as_markdown", "check_path",
    "decode_tree", "encode_tree", "from_markdown", "is_one_file", "is_safe_path", "is_tree_blob", "load_skill",
    "name_problem", "parse_front_matter", "read_archive", "read_directory", "set_field", "to_markdown", "tree_blob",
    "skill_md_path", "tree_hash", "tree_manifest", "validate_skill", "with_skill_md", "write_archive",
    "write_directory",
]
