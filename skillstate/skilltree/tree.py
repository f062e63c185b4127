"""A skill as a value: an immutable mapping of relative POSIX path -> `SkillFile`.

A file is its bytes and an executable flag. Its kind follows from its bytes alone: `text` when
they are UTF-8 without a NUL, else `binary`. Text is never re-encoded or re-ended (CRLF stays
CRLF), so every file, text or binary, is kept byte-exact; only text files may be edited.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from skillstate.errors import UserError
from skillstate.skilltree.paths import check_path

SKILL_MD = "SKILL.md"
Kind = Literal["text", "binary"]


def kind_of(data: bytes) -> Kind:
    """`text` for UTF-8 bytes without a NUL, else `binary`."""
    if b"\x00" in data:
        return "binary"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "binary"
    return "text"


@dataclass(frozen=True)
class SkillFile:
    """One file of a skill: its exact bytes and whether it is executable (scripts)."""

    data: bytes
    executable: bool = False
    kind: Kind = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes):
            raise TypeError(f"a SkillFile holds bytes, not {type(self.data).__name__}")
        object.__setattr__(self, "kind", kind_of(self.data))

    @classmethod
    def of_text(cls, text: str, *, executable: bool = False) -> SkillFile:
        """A text file (UTF-8, exactly these characters)."""
        if "\x00" in text:
            raise UserError("a skill's text file may not hold a NUL character")
        return cls(text.encode("utf-8"), executable)

    @property
    def is_binary(self) -> bool:
        return self.kind == "binary"

    @property
    def text(self) -> str:
        """The file's text; `UserError` for a binary file."""
        if self.is_binary:
            raise UserError("a binary file has no text (binary assets are kept as they are, never edited)")
        return self.data.decode("utf-8")

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


class SkillTree(Mapping[str, SkillFile]):
    """An immutable skill directory: stored path (see `paths.check_path`) -> `SkillFile`, iterated in
    sorted path order. Two paths that differ only in case, or a file that is also another path's
    directory, are refused: the tree must be writable on every platform."""

    __slots__ = ("_files", "_hash")

    def __init__(self, files: Mapping[str, SkillFile] | Iterable[tuple[str, SkillFile]] = ()):
        items = files.items() if isinstance(files, Mapping) else files
        checked: dict[str, SkillFile] = {}
        folded: dict[str, str] = {}
        for raw, file in items:
            path = check_path(raw)
            if not isinstance(file, SkillFile):
                raise TypeError(f"{path}: a SkillTree holds SkillFile values, not {type(file).__name__}")
            if path in checked:
                raise UserError(f"the skill holds {path!r} twice")
            other = folded.setdefault(path.casefold(), path)
            if other != path:
                raise UserError(f"the skill holds {other!r} and {path!r}, which differ only in case "
                                "(they would be one file on macOS and Windows)")
            checked[path] = file
        for path in checked:
            for cut in range(len(path)):
                if path[cut] == "/" and path[:cut] in checked:
                    raise UserError(f"the skill holds {path[:cut]!r} both as a file and as a directory")
        self._files = dict(sorted(checked.items()))
        self._hash: int | None = None

    def __getitem__(self, path: str) -> SkillFile:
        return self._files[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SkillTree):
            return self._files == other._files
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self._files.items()))
        return self._hash

    def __repr__(self) -> str:
        return f"SkillTree({len(self)} files: {', '.join(list(self._files)[:5])}{', …' if len(self) > 5 else ''})"

    def with_file(self, path: str, file: SkillFile) -> SkillTree:
        """This tree with `path` added or replaced."""
        return SkillTree({**self._files, check_path(path): file})

    def with_text(self, path: str, text: str) -> SkillTree:
        """This tree with the text file `path` set to `text` (an existing file keeps its executable flag)."""
        path = check_path(path)
        old = self._files.get(path)
        if old is not None and old.is_binary:
            raise UserError(f"{path} is a binary file: binary assets are never edited")
        return self.with_file(path, SkillFile.of_text(text, executable=bool(old and old.executable)))

    def without(self, path: str) -> SkillTree:
        """This tree without `path` (`UserError` when it holds no such file)."""
        path = check_path(path)
        if path not in self._files:
            raise UserError(f"the skill holds no file {path!r}")
        return SkillTree({p: f for p, f in self._files.items() if p != path})

    @property
    def skill_md_path(self) -> str | None:
        """`SKILL.md`, else a lowercase `skill.md` (which some agents accept), else None."""
        for path in (SKILL_MD, "skill.md"):
            if path in self._files:
                return path
        return None

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self._files.values())
