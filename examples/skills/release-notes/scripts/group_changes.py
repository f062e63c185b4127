#!/usr/bin/env python3
"""Group commit subjects (one per line on stdin) into release-note sections.

Reads lines such as "feat(cli): add --json to export (#12)" and prints them under the section
their type belongs to, breaking changes ("feat!:" or a "BREAKING" mark) first. Lines without a
recognised type are printed last under "Unsorted" so that none is lost.
"""

import re
import sys

SECTIONS = [
    ("Breaking changes", ()),
    ("Security", ("security",)),
    ("New features", ("feat",)),
    ("Improvements", ("perf", "refactor")),
    ("Bug fixes", ("fix",)),
    ("Deprecations", ("deprecate",)),
    ("Internal", ("test", "ci", "build", "chore", "docs", "style")),
]
SUBJECT = re.compile(r"^(?P<type>[a-z]+)(\([^)]*\))?(?P<bang>!)?:\s*(?P<text>.+)$")


def section_of(line: str) -> tuple[str, str]:
    match = SUBJECT.match(line)
    if match is None:
        return "Unsorted", line
    if match.group("bang") or "BREAKING" in line:
        return "Breaking changes", match.group("text")
    for title, types in SECTIONS:
        if match.group("type") in types:
            return title, match.group("text")
    return "Unsorted", line


def main() -> None:
    grouped: dict[str, list[str]] = {}
    for raw in sys.stdin:
        line = raw.strip()
        if line:
            title, text = section_of(line)
            grouped.setdefault(title, []).append(text)
    for title in [t for t, _ in SECTIONS] + ["Unsorted"]:
        if grouped.get(title):
            print(f"## {title}")
            print("\n".join(f"- {entry}" for entry in grouped[title]))
            print()


if __name__ == "__main__":
    main()
