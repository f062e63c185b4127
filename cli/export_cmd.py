"""Commands that write a run's results out, with no LLM call: export (the
skill or bank, as markdown, an Agent Skills directory or archive, or
SkillRL's bank JSON), export-sft and export-grpo (training data for TRL)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from skillstate.cli.app import cli, step_arg
from skillstate.cli.app import existing_db_option as db_option
from skillstate.errors import UserError

# Each command imports the store and the exporters it uses when it runs: `skillstate --help` loads none of them.


@cli.command()
@click.argument("run_id", required=False)
@click.option("--step", help="The current skill after this step (default: the run's best skill).")
@click.option("--best", is_flag=True, help="With --step: the best skill up to that step instead (without --step the "
                                           "best skill is what is exported anyway).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
              help="Write to FILE: markdown, or an Agent Skills archive when FILE ends in .skill or .zip.")
@click.option("--into", type=click.Path(file_okay=False),
              help="Write the skill as the Agent Skills directory INTO/NAME (e.g. --into .claude/skills).")
@click.option("--force", is_flag=True, help="With --into or an archive: replace what is there (a skill directory "
                                            "or an archive only).")
@click.option("--format", "fmt", type=click.Choice(["skillrl"]),
              help="A bank run's bank in SkillRL's own bank JSON (general_skills, task_specific_skills, "
                   "common_mistakes) instead of skillstate's.")
@click.option("--grading", "grading_dir", type=click.Path(file_okay=False),
              help="Also write the run's test gradings (env evals) in skill-creator's layout: "
                   "DIR/eval-ID/with_skill|old_skill|without_skill/grading.json and outputs/output.md.")
@db_option
def export(run_id, step, best, output, into, force, fmt, grading_dir, db) -> None:
    """Print (or write) a skill as markdown, or write it as an Agent Skill
    that installs as is. Without --step: the run's best skill; with --step N:
    the current skill after step N (with --best, the best one up to step N).

    A run of a skill directory (or archive) exports that directory with
    its SKILL.md as trained; a markdown skill exports as an Agent Skill only
    when it opens with a front matter naming it; a bank (mode bank) exports
    with --into as one Agent Skill per bank skill.

    \b
    Examples:
        skillstate export -o skill.md
        skillstate export my-run --step 3
        skillstate export --into .claude/skills
        skillstate export -o my-skill.skill
        skillstate export bank-run --format skillrl -o skillrl_bank.json
        skillstate export --into skills --grading review   # a skill trained on its evals, and its gradings
    """
    from skillstate.reading.history import skill_at
    from skillstate.storage.store import open_store

    store = open_store(db, create=False)
    if grading_dir is not None:
        _export_grading(store, run_id, grading_dir)
        if not (output or into or fmt):  # the gradings alone
            return
    if fmt is None and (into or (output and output.lower().endswith((".skill", ".zip")))):
        _export_tree(store, run_id, step_arg(step), best, output, into, force)
        return
    rid, text = skill_at(store, run_id, step_arg(step), best=best)
    what = _which(rid, step_arg(step), best)
    if fmt == "skillrl":
        from skillstate.reading.bank_provenance import is_bank_run

        if into or not is_bank_run(store, rid):
            raise UserError("--format skillrl writes a bank run's bank as one JSON file (use -o FILE, not --into)"
                            if into else f"run {rid!r} is not a bank run (mode bank): it has no bank to write")
        from skillstate.bank.document import read_bank
        from skillstate.bank.skillrl_format import to_skillrl

        bank = read_bank(text)
        text = json.dumps(to_skillrl(bank), indent=2, ensure_ascii=False) + "\n"
        what = f"{what.replace('skill', 'bank', 1)} as SkillRL's bank JSON ({_count(len(bank.skills), 'skill')})"
    else:
        what += f" as markdown ({_count(len(text.splitlines()), 'line')})"
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as err:
            raise UserError(f"cannot write {output}: {err.strerror or err}") from None
        click.echo(f"wrote {output}: {what}")  # every write says what it wrote, and where
    else:
        click.echo(text, nl=not text.endswith("\n"))


def _export_grading(store, run_id, folder) -> None:
    from skillstate.exports.grading import grading_files

    rid, files = grading_files(store, run_id)
    base = Path(folder).expanduser()
    try:
        for name, text in files.items():
            path = base / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise UserError(f"cannot write {err.filename or folder}: {err.strerror or err}") from None
    gradings = sum(1 for name in files if name.endswith("grading.json"))
    click.echo(f"wrote {base}: {_count(gradings, 'grading')} of run {rid} in skill-creator's layout")


def _which(rid: str, step: int | None, best: bool) -> str:
    """Which skill `export` takes, in words."""
    if step is None:
        return f"the best skill of run {rid}"
    return f"the best skill of run {rid} up to step {step}" if best else f"the skill of run {rid} after step {step}"


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'s' * (n != 1)}"


def _export_tree(store, run_id, step, best, output, into, force) -> None:
    from skillstate.reading.skill_export import installable_skills
    from skillstate.skilltree import write_archive, write_directory

    if output and into:
        raise UserError("give either --into DIR or an archive with -o, not both")
    rid, skills = installable_skills(store, run_id, step, best=best)
    what = _which(rid, step, best)
    try:
        if into:
            targets = [Path(into).expanduser() / name for name, _ in skills]
            for target in targets:  # refuse before writing any, so a bank is never half exported
                _check_replaceable(target, force)
            for (name, tree), target in zip(skills, targets, strict=True):
                written = write_directory(tree, target, replace=force)
                source = what if len(skills) == 1 else "from " + what.replace("skill", "bank", 1)
                click.echo(f"wrote {written}: the Agent Skill {name}, {source} ({_count(len(tree), 'file')})")
            return
        if len(skills) > 1:
            raise UserError(f"run {rid!r} is a bank of {len(skills)} skills: write them with --into DIR, one "
                            "directory each")
        name, tree = skills[0]
        written = write_archive(tree, output, name, replace=force)
    except OSError as err:
        raise UserError(f"cannot write {err.filename or into or output}: {err.strerror or err}") from None
    click.echo(f"wrote {written}: the Agent Skill {name} as an archive, {what} ({_count(len(tree), 'file')})")


def _check_replaceable(target: Path, force: bool) -> None:
    """What `write_directory` would refuse at `target`, refused before anything is written."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise UserError(f"{target}: exists and is not a directory")
    if target.exists() and any(target.iterdir()):
        if not force:
            raise UserError(f"{target}: exists (pass --force to replace it)")
        if not any((target / n).is_file() for n in ("SKILL.md", "skill.md")):
            raise UserError(f"{target}: not empty and holds no SKILL.md, so it is not replaced")


@cli.command("export-sft")
@click.argument("run_id", required=False)
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), required=True,
              help="Write the rows to FILE (JSON lines).")
@click.option("--with-imported", is_flag=True,
              help="A bank run: also the successful trajectories it imported (bank.trajectories), with the skills "
                   "its best bank gives their category as the system message.")
@db_option
def export_sft(run_id, output, with_imported, db) -> None:
    """Write the run's successful rollouts as SFT data for TRL: one
    {"messages": [...]} row per conversation, with what the agent was shown
    (the skill, or the retrieved bank skills) as the system message.

    \b
    Examples:
        skillstate export-sft -o sft.jsonl
        skillstate export-sft bank-run --with-imported -o sft.jsonl
        python -c "import datasets; print(datasets.load_dataset('json', data_files='sft.jsonl'))"
    """
    from skillstate.exports.training_data import sft_rows
    from skillstate.storage.store import open_store

    store = open_store(db, create=False)
    rid = store.require_run(run_id).run_id
    rows, skipped = sft_rows(store, rid)
    imported = ""
    if with_imported:
        from skillstate.exports.imported_sft import imported_sft_rows

        extra = imported_sft_rows(store, rid)
        rows, imported = extra + rows, f" ({len(extra)} from imported trajectories)"
    note = f"; {skipped} tool-calling trajectories skipped (tool calls are not exported)" if skipped else ""
    if not rows:  # an empty file would pass for data
        raise UserError(f"run {rid!r} has no successful conversation to export{note}; nothing written")
    _write_rows(output, rows)
    click.echo(f"wrote {len(rows)} conversations{imported} to {output}{note}")


@cli.command("export-grpo")
@click.argument("run_id")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), required=True,
              help="Write the rows to FILE (JSON lines).")
@db_option
def export_grpo(run_id, output, db) -> None:
    """Write an evaluation run sampled G > 1 times per item as GRPO data for
    TRL: per item the prompt, the G completions, their rewards and their
    group-relative advantages. On a multi-turn environment a group is the G
    episodes of one task: each sample is the episode's conversation and its
    reward the episode's. A run with no group to export is an error, and no
    file is written.

    \b
    Examples:
        skillstate eval --skill best.md --split train --samples 4 --set target.temperature=1.0 --run-id g
        skillstate export-grpo g -o grpo.jsonl
    """
    from skillstate.exports.training_data import grpo_rows
    from skillstate.storage.store import open_store

    store = open_store(db, create=False)
    rid = store.require_run(run_id).run_id
    rows, skipped, failed = grpo_rows(store, rid)
    note = f"; {skipped} tool-calling items skipped (tool calls are not exported)" if skipped else ""
    note += f"; {failed} items left out: a sample's call failed" if failed else ""
    if not rows:  # an empty file would pass for data
        raise UserError(f"run {rid!r} has no group to export{note}; nothing written")
    _write_rows(output, rows)
    click.echo(f"wrote {len(rows)} groups to {output}{note}")


def _write_rows(output: str, rows: list[dict[str, Any]]) -> None:
    try:
        with Path(output).open("w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    except OSError as err:
        raise UserError(f"cannot write {output}: {err.strerror or err}") from None
