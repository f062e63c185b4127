"""A skill as a `.zip` or `.skill` archive (zip format): read one into a tree, write a tree as one.

An archive written here holds the skill under one top-level directory NAME/, so that unpacking
it where an agent looks for skills (`.claude/skills/`, `.agents/skills/`, `~/.codex/skills/`)
installs it as is. Its bytes depend only on the tree and the name: entries sorted, timestamps
fixed at 1980-01-01, modes 644/755 (DEFLATE output also depends on the zlib build).

Reading accepts that layout or SKILL.md at the top. Every entry passes `paths.check_path`
(zip-slip: absolute, `..`, backslash and drive-letter names are refused), links, encrypted and
duplicate entries are refused, and the `Limits` bound the entries' count and declared sizes.
"""

from __future__ import annotations

import io
import os
import stat
import tempfile
import zipfile
import zlib
from pathlib import Path

from skillstate.errors import UserError
from skillstate.skilltree.limits import DEFAULT_LIMITS, Limits, read_bounded, size_text
from skillstate.skilltree.paths import check_path, is_ignored, path_problem, shown_path
from skillstate.skilltree.tree import SkillFile, SkillTree

ARCHIVE_SUFFIXES = (".zip", ".skill")
_EPOCH = (1980, 1, 1, 0, 0, 0)


def read_archive(path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS) -> tuple[SkillTree, str | None]:
    """The tree an archive file holds and the name of its top-level directory (None when SKILL.md
    is at the top)."""
    source = Path(path)
    return archive_tree(read_bounded(source, limits.max_total_bytes, "a skill"), str(source), limits)


def archive_tree(data: bytes, label: str = "archive",
                 limits: Limits = DEFAULT_LIMITS) -> tuple[SkillTree, str | None]:
    """`read_archive` of the archive's bytes; `label` names it in errors."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            raw = _entries(archive, label, limits)
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise UserError(f"{label}: not a readable zip archive ({err})") from None
    return _strip_top(raw, label)


def _entries(archive: zipfile.ZipFile, label: str, limits: Limits) -> dict[str, SkillFile]:
    infos = archive.infolist()
    if len(infos) > 4 * limits.max_files:
        raise UserError(f"{label}: holds {len(infos):,} entries, more than a skill may ({limits.max_files:,} files)")
    files: dict[str, SkillFile] = {}
    total = 0
    for info in infos:
        name = info.orig_filename  # as stored: zipfile turns '\\' into '/' on Windows only
        while name.startswith("./"):
            name = name[2:]  # some tools write ./NAME/SKILL.md: the same place, and harmless
        if info.is_dir() and name.endswith("/"):
            name = name[:-1]
        if info.is_dir() and name in ("", "."):
            continue
        if is_ignored(name):
            continue  # never written anywhere, so never a danger: __MACOSX/, .DS_Store, .git/
        problem = path_problem(name)
        if problem is not None:
            raise UserError(f"{label}: entry {shown_path(info.orig_filename)} refused: {problem}")
        name = check_path(name)
        mode = info.external_attr >> 16
        if info.is_dir():
            continue
        if stat.S_ISLNK(mode):
            raise UserError(f"{label}: entry {name!r} is a symbolic link (a skill archive holds files only)")
        if info.flag_bits & 0x1:
            raise UserError(f"{label}: entry {name!r} is encrypted")
        if name in files:
            raise UserError(f"{label}: holds {name!r} twice")
        if len(files) >= limits.max_files:
            raise UserError(f"{label}: holds more than {limits.max_files:,} files, more than a skill may")
        if info.file_size > limits.max_file_bytes:
            raise UserError(f"{label}: entry {name!r} unpacks to {size_text(info.file_size)}, more than a "
                            f"skill file may hold ({size_text(limits.max_file_bytes)})")
        total += info.file_size
        if total > limits.max_total_bytes:
            raise UserError(f"{label}: unpacks to more than {size_text(limits.max_total_bytes)}, more than a "
                            "skill may hold")
        try:
            with archive.open(info) as handle:
                content = handle.read(limits.max_file_bytes + 1)
        except (RuntimeError, NotImplementedError) as err:
            raise UserError(f"{label}: cannot unpack {name!r} ({err})") from None
        if len(content) != info.file_size:
            raise UserError(f"{label}: entry {name!r} does not unpack to its declared size")
        executable = info.create_system == 3 and bool(mode & stat.S_IXUSR)
        files[name] = SkillFile(content, executable=executable)
    return files


def _strip_top(files: dict[str, SkillFile], label: str) -> tuple[SkillTree, str | None]:
    if not files:
        raise UserError(f"{label}: the archive holds no files")
    tops = {p.split("/", 1)[0] for p in files}
    if len(tops) == 1 and all("/" in p for p in files):
        (top,) = tops
        return SkillTree({p.split("/", 1)[1]: f for p, f in files.items()}), top
    return SkillTree(files), None


def archive_bytes(tree: SkillTree, name: str) -> bytes:
    """The deterministic archive of `tree` under the top-level directory `name`."""
    top = check_path(name)
    if "/" in top:
        raise UserError(f"the archive's top-level directory must be one name, not {name!r}")
    dirs = {top}
    for path in tree:
        parts = path.split("/")[:-1]
        dirs |= {"/".join([top, *parts[:i]]) for i in range(1, len(parts) + 1)}
    entries = [(d + "/", None) for d in dirs] + [(f"{top}/{p}", f) for p, f in tree.items()]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for entry, file in sorted(entries, key=lambda e: e[0]):
            info = zipfile.ZipInfo(entry, date_time=_EPOCH)
            info.create_system = 3
            if file is None:
                info.external_attr = (stat.S_IFDIR | 0o755) << 16 | 0x10
                archive.writestr(info, b"")
                continue
            info.external_attr = (stat.S_IFREG | (0o755 if file.executable else 0o644)) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, file.data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    return buffer.getvalue()


def is_archive_path(path: str | os.PathLike[str]) -> bool:
    return Path(path).suffix.lower() in ARCHIVE_SUFFIXES


def write_archive(tree: SkillTree, path: str | os.PathLike[str], name: str, *, replace: bool = False) -> Path:
    """Write `archive_bytes(tree, name)` to `path` (a `.zip` or `.skill` file), atomically. An
    existing file is replaced only with `replace`."""
    out = Path(path)
    if not is_archive_path(out):
        raise UserError(f"{out}: an archive's name ends in .skill or .zip")
    if out.exists() and (not replace or not out.is_file()):
        raise UserError(f"{out}: exists (pass --force to replace it)" if out.is_file() else f"{out}: exists")
    data = archive_bytes(tree, name)
    temp: str | None = None
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.chmod(temp, 0o644)
        os.replace(temp, out)
    except OSError as err:
        if temp is not None and os.path.exists(temp):
            os.unlink(temp)
        raise UserError(f"{out}: cannot write the archive ({err.strerror or err})") from None
    return out
