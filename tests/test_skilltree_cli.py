"""`skillstate skill check|pack|unpack`: the example skill passes; each bad input gives one line,
exit code 2 and no traceback; pack and unpack round-trip and never clobber."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from skillstate.cli.main import cli
from skillstate.skilltree import load_skill, read_directory

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "skills" / "release-notes"


def run(*args: str, code: int = 0):
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    return res


def one_error(*args: str, match: str) -> str:
    res = run(*args, code=2)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert match in lines[0], lines[0]
    return lines[0]


def make_skill(root: Path, dir_name: str = "my-skill", front: str | None = None, **files: str) -> Path:
    skill = root / dir_name
    skill.mkdir(parents=True)
    if front is not None:
        (skill / "SKILL.md").write_text(front)
    for path, text in files.items():
        (skill / path).parent.mkdir(parents=True, exist_ok=True)
        (skill / path).write_text(text)
    return skill


def front(name: str = "my-skill", description: str = "Does things. Use when asked.") -> str:
    return f"---\nname: {name}\ndescription: {description}\n---\n\n# Steps\n"


def test_the_example_skill_passes_without_warnings():
    res = run("skill", "check", str(EXAMPLE))
    assert res.stderr == ""
    assert res.stdout.startswith("ok: release-notes: 4 files, ") and "description " in res.stdout
    report = json.loads(run("skill", "check", str(EXAMPLE), "--json").stdout)
    assert report["ok"] and report["name"] == "release-notes" and not report["warnings"]
    assert {f["path"] for f in report["files"]} == {"SKILL.md", "references/sections.md", "references/style.md",
                                                    "scripts/group_changes.py"}
    assert load_skill(EXAMPLE / "SKILL.md").tree == load_skill(EXAMPLE).tree


def test_warnings_go_to_stderr_and_do_not_fail(tmp_path):
    skill = make_skill(tmp_path, front=front().replace("# Steps", "See [it](references/missing.md)."))
    res = run("skill", "check", str(skill))
    assert res.stderr == f"warning: {skill}: SKILL.md: links to references/missing.md, which the skill does not hold\n"
    assert res.stdout.startswith("ok: my-skill: 1 file, ")


def test_a_plain_markdown_file_is_a_one_file_skill(tmp_path):
    (tmp_path / "qa.md").write_text("# QA\n\nOne word.\n")
    res = run("skill", "check", str(tmp_path / "qa.md"))
    assert res.stdout.startswith(f"ok: {tmp_path / 'qa.md'} is a plain markdown skill: 1 file")
    (tmp_path / "bad.md").write_text(front(name="Bad"))
    one_error("skill", "check", str(tmp_path / "bad.md"), match=f"{tmp_path / 'bad.md'}: name 'Bad' has uppercase")


def evil_zip(path: Path) -> Path:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("my-skill/SKILL.md", front())
        info = zipfile.ZipInfo("x")
        info.filename = info.orig_filename = "my-skill/../../evil.sh"
        archive.writestr(info, "rm -rf ~")
    path.write_bytes(buffer.getvalue())
    return path


@pytest.mark.parametrize("case, match", [
    ("missing", "no such file or directory"),
    ("no-skill-md", "SKILL.md is missing"),
    ("no-front-matter", "SKILL.md: has no front matter"),
    ("bad-name", "SKILL.md: name 'My_Skill' has uppercase letters"),
    ("name-not-dir", "SKILL.md: name 'other' differs from its directory's name 'my-skill'"),
    ("long-description", "SKILL.md: description is 1,025 characters long; at most 1,024 are allowed"),
    ("unclosed", "is never closed"),
    ("zip-slip", "entry 'my-skill/../../evil.sh' refused: it has a '..' segment"),
    ("not-a-zip", "not a readable zip archive"),
    ("symlink-out", "a symbolic link that points outside the skill directory"),
])
def test_each_bad_input_is_one_line_and_exit_2(tmp_path, case, match):
    if case == "missing":
        target = tmp_path / "nope"
    elif case == "no-skill-md":
        target = make_skill(tmp_path, **{"README.md": "hi"})
    elif case == "no-front-matter":
        target = make_skill(tmp_path, front="# Steps\n")
    elif case == "bad-name":
        target = make_skill(tmp_path, front=front(name="My_Skill"))
    elif case == "name-not-dir":
        target = make_skill(tmp_path, front=front(name="other"))
    elif case == "long-description":
        target = make_skill(tmp_path, front=front(description="d" * 1025))
    elif case == "unclosed":
        target = make_skill(tmp_path, front="---\nname: my-skill\n")
    elif case == "zip-slip":
        target = evil_zip(tmp_path / "evil.skill")
    elif case == "not-a-zip":
        target = tmp_path / "junk.skill"
        target.write_bytes(b"not a zip at all")
    else:
        target = make_skill(tmp_path, front=front())
        (tmp_path / "secret").write_text("s")
        os.symlink(tmp_path / "secret", target / "leak.md")
    line = one_error("skill", "check", str(target), match=match)
    assert str(target) in line
    assert not (tmp_path.parent / "evil.sh").exists() and not (tmp_path / "evil.sh").exists()
    res = run("skill", "check", str(target), "--json", code=2)
    report = json.loads(res.stdout)
    assert report["ok"] is False and match in report["errors"][0]


def test_several_errors_are_one_line_that_counts_the_rest(tmp_path):
    skill = make_skill(tmp_path, front=front(name="Bad", description="''"))
    one_error("skill", "check", str(skill), match="(and 1 more; see skillstate skill check --json)")
    assert len(json.loads(run("skill", "check", str(skill), "--json", code=2).stdout)["errors"]) == 2


def test_pack_then_unpack_installs_the_same_skill(tmp_path):
    out = tmp_path / "release-notes.skill"
    res = run("skill", "pack", str(EXAMPLE), str(out))
    assert res.stdout.startswith(f"wrote {out}: release-notes/ with 4 files, ")
    first = out.read_bytes()
    one_error("skill", "pack", str(EXAMPLE), str(out), match="exists (pass --force to replace it)")
    run("skill", "pack", str(EXAMPLE), str(out), "--force")
    assert out.read_bytes() == first  # the same skill packs to the same bytes
    assert zipfile.ZipFile(out).namelist()[0] == "release-notes/"
    skills = tmp_path / ".claude" / "skills"
    assert run("skill", "unpack", str(out), str(skills)).stdout == f"wrote {skills / 'release-notes'} (4 files)\n"
    assert read_directory(skills / "release-notes") == read_directory(EXAMPLE)
    assert os.access(skills / "release-notes" / "scripts" / "group_changes.py", os.X_OK)
    one_error("skill", "unpack", str(out), str(skills), match="not empty (pass --force to replace it)")
    run("skill", "unpack", str(out), str(skills), "--force")
    run("skill", "check", str(skills / "release-notes"))


def test_pack_refuses_an_invalid_skill_and_a_nameless_one(tmp_path):
    bad = make_skill(tmp_path, front=front(name="other"))
    one_error("skill", "pack", str(bad), str(tmp_path / "x.skill"), match="differs from its directory's name")
    (tmp_path / "plain.md").write_text("# Plain\n")
    one_error("skill", "pack", str(tmp_path / "plain.md"), str(tmp_path / "x.skill"),
              match="plain.md: has no front matter")
    one_error("skill", "pack", str(EXAMPLE), str(tmp_path / "x.tar"), match="ends in .skill or .zip")
    assert not list(tmp_path.glob("*.skill"))
