"""`skillstate skill check|pack|unpack`: Agent Skills directories and archives (skillstate.skilltree)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from skillstate.cli.app import CLIError, cli, echo_json
from skillstate.errors import UserError

if TYPE_CHECKING:
    from skillstate.skilltree import Finding, LoadedSkill, SkillReport


@cli.group("skill")
def skill() -> None:
    """Agent Skills: check a skill directory, archive or markdown file
    against the specification, and pack or unpack .skill archives.

    \b
    Example:
        skillstate skill check .claude/skills/release-notes
        skillstate skill pack .claude/skills/release-notes release-notes.skill
        skillstate skill unpack release-notes.skill ~/.codex/skills
    """


def _checked(path: str, plain_ok: bool = True) -> tuple[LoadedSkill, SkillReport]:
    """The skill at `path` and its report; a lone markdown file without a front matter is a valid
    (one-file) skill only when `plain_ok`."""
    from skillstate.skilltree import load_skill, validate_skill
    from skillstate.skilltree.load import not_a_markdown_skill

    loaded = load_skill(path)
    problem = not_a_markdown_skill(loaded)
    if problem is not None:
        raise UserError(problem)
    return loaded, validate_skill(loaded.tree, loaded.dir_name, allow_plain=plain_ok and loaded.source == "markdown")


def _line(loaded: LoadedSkill, finding: Finding) -> str:
    """A finding as one line, naming the file the user gave (a lone markdown file stands in for SKILL.md)."""
    if loaded.source == "markdown":
        return f"{loaded.path}: {finding.message}"
    return f"{loaded.path}: {finding}"


def _valid(path: str, plain_ok: bool = True) -> tuple[LoadedSkill, SkillReport]:
    """The skill at `path`, its warnings printed; CLIError (exit 2) with its first error when invalid."""
    loaded, report = _checked(path, plain_ok)
    if not report.ok:
        more = len(report.errors) - 1
        raise CLIError(_line(loaded, report.errors[0]) + (f" (and {more} more; see skillstate skill check --json)"
                                                          if more else ""))
    for finding in report.warnings:
        click.echo(f"warning: {_line(loaded, finding)}", err=True)
    return loaded, report


def _summary(loaded: LoadedSkill, report: SkillReport) -> str:
    from skillstate.skilltree.limits import size_text

    binary = sum(1 for f in loaded.tree.values() if f.is_binary)
    files = f"{report.files} file{'s' if report.files != 1 else ''}"
    kinds = f" ({report.files - binary} text, {binary} binary)" if binary else ""
    if not report.agent_skill:
        return f"ok: {loaded.path} is a plain markdown skill: {files}, {size_text(report.total_bytes)}, " \
               f"{report.body_lines} lines"
    description = len(report.description or "")
    return (f"ok: {report.name}: {files}{kinds}, {size_text(report.total_bytes)}; description {description:,}/1,024 "
            f"characters; SKILL.md body {report.body_lines:,} lines")


def _as_json(loaded: LoadedSkill | None, report: SkillReport | None, error: str | None = None) -> dict[str, Any]:
    if loaded is None or report is None:
        return {"ok": False, "errors": [error], "warnings": []}
    return {
        "ok": report.ok, "path": loaded.path, "source": loaded.source, "dir_name": loaded.dir_name,
        "agent_skill": report.agent_skill, "name": report.name,
        "description_chars": len(report.description) if report.description is not None else None,
        "body_lines": report.body_lines, "total_bytes": report.total_bytes,
        "files": [{"path": p, "kind": f.kind, "size": f.size, "executable": f.executable}
                  for p, f in loaded.tree.items()],
        "errors": [_line(loaded, e) for e in report.errors],
        "warnings": [_line(loaded, w) for w in report.warnings],
    }


@skill.command("check")
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the exit code is the same).")
def check(path: str, as_json: bool) -> None:
    """Check a skill against the Agent Skills specification.

    PATH is a skill directory (or its SKILL.md), a .skill or .zip archive,
    or a markdown file (a one-file skill, named .md or .markdown; any other
    file is refused). Prints the warnings, then one
    summary line; exit code 2 with one line saying what is wrong when the
    skill is not valid.

    \b
    Example:
        skillstate skill check examples/skills/release-notes
        skillstate skill check release-notes.skill --json
    """
    if not as_json:
        loaded, report = _valid(path)
        click.echo(_summary(loaded, report))
        return
    try:
        loaded, report = _checked(path)
    except UserError as err:
        echo_json(_as_json(None, None, str(err)))
        raise SystemExit(2) from None
    echo_json(_as_json(loaded, report))
    if not report.ok:
        raise SystemExit(2)


@skill.command("pack")
@click.argument("source", type=click.Path())
@click.argument("out", type=click.Path())
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
def pack(source: str, out: str, force: bool) -> None:
    """Pack a valid skill into a .skill (or .zip) archive.

    The archive holds the skill under one directory named after it, so
    unpacking it in .claude/skills/, .agents/skills/ or ~/.codex/skills/
    installs it. The same skill always packs to the same bytes.

    \b
    Example:
        skillstate skill pack examples/skills/release-notes release-notes.skill
    """
    from skillstate.skilltree import write_archive
    from skillstate.skilltree.limits import size_text

    loaded, report = _valid(source, plain_ok=False)
    assert report.name is not None  # a valid Agent Skill has one
    written = write_archive(loaded.tree, out, report.name, replace=force)
    click.echo(f"wrote {written}: {report.name}/ with {report.files} file{'s' * (report.files != 1)}, "
               f"{size_text(written.stat().st_size)}")


@skill.command("unpack")
@click.argument("archive", type=click.Path())
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Replace DIRECTORY/NAME if it is a skill directory already.")
def unpack(archive: str, directory: str, force: bool) -> None:
    """Unpack a valid skill archive into DIRECTORY/NAME.

    NAME is the skill's name. DIRECTORY is where an agent looks for skills,
    e.g. .claude/skills, .agents/skills or ~/.codex/skills.

    \b
    Example:
        skillstate skill unpack release-notes.skill .claude/skills
    """
    from pathlib import Path

    from skillstate.skilltree import write_directory

    loaded, report = _valid(archive, plain_ok=False)
    assert report.name is not None  # a valid Agent Skill has one
    written = write_directory(loaded.tree, Path(directory).expanduser() / report.name, replace=force)
    click.echo(f"wrote {written} ({report.files} file{'s' * (report.files != 1)})")
