"""A skill directory on disk: read it into a tree, write a tree out as one.

Reading follows a symbolic link only when it resolves inside the directory (its target's
contents are read as a plain file or directory), refuses one that leads outside or loops, skips
version-control and cache clutter (`paths.IGNORED_NAMES`), and stops at the `Limits`. Writing
builds the directory beside its destination and renames it into place, so a failure leaves
nothing half written; an existing non-empty destination is replaced only when asked, and only
when it is itself a skill directory (it holds SKILL.md).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from skillstate.errors import UserError
from skillstate.skilltree.limits import DEFAULT_LIMITS, Limits, size_text
from skillstate.skilltree.paths import IGNORED_NAMES, check_path
from skillstate.skilltree.tree import SkillFile, SkillTree


def read_directory(directory: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS) -> SkillTree:
    """The tree of a skill directory (`UserError` naming the path on anything unsafe or too big)."""
    root = Path(directory)
    if not root.is_dir():
        raise UserError(f"{root}: not a directory")
    real_root = root.resolve()
    files: dict[str, SkillFile] = {}
    total = 0

    def walk(real_dir: Path, rel: str, seen: frozenset[Path]) -> None:
        nonlocal total
        try:
            entries = sorted(os.scandir(real_dir), key=lambda e: e.name)
        except OSError as err:
            raise UserError(f"{root / rel if rel else root}: cannot list it ({err.strerror or err})") from None
        for entry in entries:
            if entry.name in IGNORED_NAMES:
                continue
            path = f"{rel}/{entry.name}" if rel else entry.name
            shown = root / path
            real = Path(entry.path)
            if entry.is_symlink():
                real = real.resolve()
                if real != real_root and real_root not in real.parents:
                    raise UserError(f"{shown}: a symbolic link that points outside the skill directory")
                if not real.exists():
                    raise UserError(f"{shown}: a broken symbolic link")
            check_path(path)
            mode = real.stat().st_mode
            if stat.S_ISDIR(mode):
                if real in seen:
                    raise UserError(f"{shown}: a symbolic link loop")
                walk(real, path, seen | {real})
                continue
            if not stat.S_ISREG(mode):
                raise UserError(f"{shown}: not a regular file (a skill holds files and directories only)")
            size = real.stat().st_size
            if size > limits.max_file_bytes:
                raise UserError(f"{shown}: {size_text(size)} is more than a skill file may hold "
                                f"({size_text(limits.max_file_bytes)})")
            total += size
            if len(files) >= limits.max_files:
                raise UserError(f"{root}: holds more than {limits.max_files:,} files: is it a skill directory?")
            if total > limits.max_total_bytes:
                raise UserError(f"{root}: holds more than {size_text(limits.max_total_bytes)}: "
                                "is it a skill directory?")
            try:
                data = real.read_bytes()
            except OSError as err:
                raise UserError(f"{shown}: cannot read it ({err.strerror or err})") from None
            files[path] = SkillFile(data, executable=bool(mode & stat.S_IXUSR))

    walk(real_root, "", frozenset({real_root}))
    return SkillTree(files)


def write_directory(tree: SkillTree, directory: str | os.PathLike[str], *, replace: bool = False) -> Path:
    """Write `tree` as the directory `directory` (created with its parents). A non-empty one is
    replaced only with `replace`, and only if it holds SKILL.md (so a wrong path can never wipe
    a directory that is not a skill). Returns the directory's path."""
    dest = Path(directory)
    if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
        raise UserError(f"{dest}: exists and is not a directory")
    existing = dest.exists() and any(dest.iterdir())
    if existing:
        if not replace:
            raise UserError(f"{dest}: not empty (pass --force to replace it)")
        if not any((dest / name).is_file() for name in ("SKILL.md", "skill.md")):
            raise UserError(f"{dest}: not empty and holds no SKILL.md, so it is not replaced")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        for path, file in tree.items():
            target = staging.joinpath(*path.split("/"))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(file.data)
            target.chmod(0o755 if file.executable else 0o644)
        staging.chmod(0o755)
        if dest.exists():
            old = dest.with_name(staging.name + ".old")
            dest.rename(old)
            staging.rename(dest)
            shutil.rmtree(old)
        else:
            staging.rename(dest)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(f"{dest}: cannot write the skill ({err.strerror or err})") from None
    return dest
