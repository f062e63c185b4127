"""Path confinement of a skill tree (issue 23): hostile paths are refused in a tree, on disk and in
an archive, with one line naming the path; every path that is accepted stays inside the skill."""

from __future__ import annotations

import io
import os
import posixpath
import zipfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skillstate.errors import UserError
from skillstate.skilltree import SkillFile, SkillTree, archive_tree, check_path, is_safe_path, read_directory

HOSTILE = [
    "", "/etc/passwd", "../x", "a/../../x", "a/..", "..", ".", "./a", "a/./b", "a//b", "a/", "/",
    "C:/x", "c:x", "a\\b", "..\\x", "a/\x00b", "\x00", "a/\nb", "．．/x", "a/．．", "a／..／b", "x/..／y",
    "CON", "a/nul.txt", "a/b.", "a/b ", "a:b", "a*b", "what?.md", ".git/config", "a/__pycache__/x.pyc",
    "x/" * 40 + "y", "n" * 256,
]


@pytest.mark.parametrize("path", HOSTILE)
def test_hostile_paths_are_refused_in_one_line_naming_the_path(path):
    with pytest.raises(UserError) as err:
        check_path(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith("unsafe path ")
    assert repr(path)[:40].rstrip("'") in message or len(repr(path)) > 80
    with pytest.raises(UserError):
        SkillTree({path: SkillFile(b"x")})


@pytest.mark.parametrize("path", ["SKILL.md", "references/api guide.md", "scripts/run.sh", "assets/logo.png",
                                  "a/b/c/d.txt", ".hidden", "café/naïve.md", "日本語.md", "a-b_c.d.e"])
def test_ordinary_paths_are_kept(path):
    assert check_path(path) == path


PIECES = st.sampled_from(["..", ".", "", "a", "b.md", "．．", "／", "\\", "C:", "/", "\x00", " ", "ｃｏｎ", "%2e%2e",
                          "\u2024\u2024", "\ufe52\ufe52", "\u0338", "e\u0301"])


@given(st.lists(PIECES, min_size=1, max_size=6), st.sampled_from(["/", "", "\\"]))
@settings(max_examples=400)
def test_an_accepted_path_never_leaves_the_skill_directory(pieces, joiner):
    path = joiner.join(pieces)
    if not is_safe_path(path):
        with pytest.raises(UserError):
            check_path(path)
        return
    stored = check_path(path)
    assert not stored.startswith("/") and "\\" not in stored and "\x00" not in stored
    assert ".." not in stored.split("/") and "" not in stored.split("/")
    root = "/skill/root"
    assert posixpath.normpath(posixpath.join(root, stored)).startswith(root + "/")


@given(st.lists(st.sampled_from(["a", "b", "refs", "x.md"]), min_size=0, max_size=3),
       st.sampled_from(["..", "", ".", "/", "C:", "a\\..", "．．"]),
       st.lists(st.sampled_from(["a", "b", "x.md"]), min_size=0, max_size=3))
def test_a_hostile_segment_anywhere_is_refused(before, bad, after):
    path = "/".join([*before, bad, *after]) if bad != "/" else "/" + "/".join([*before, *after, "x"])
    assert not is_safe_path(path)


def zip_with(names: list[str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("skill/SKILL.md", "---\nname: skill\ndescription: d\n---\n")
        for name in names:
            info = zipfile.ZipInfo("placeholder")
            info.filename = name  # set after construction: ZipInfo() itself would normalize it
            info.orig_filename = name
            archive.writestr(info, b"evil")
    return buffer.getvalue()


@pytest.mark.parametrize("name", ["../evil", "skill/../../evil", "/etc/evil", "C:/evil", "skill\\..\\..\\evil",
                                  "skill/．．/．．/evil", "skill/a//b"])
def test_zip_slip_entries_are_refused(name):
    with pytest.raises(UserError, match="refused") as err:
        archive_tree(zip_with([name]), "evil.skill")
    assert "\n" not in str(err.value) and str(err.value).startswith("evil.skill: entry ")


def test_a_link_entry_in_an_archive_is_refused():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("skill/SKILL.md", "---\nname: skill\ndescription: d\n---\n")
        info = zipfile.ZipInfo("skill/link")
        info.create_system = 3
        info.external_attr = (0o120777) << 16
        archive.writestr(info, "/etc/passwd")
    with pytest.raises(UserError, match="symbolic link"):
        archive_tree(buffer.getvalue(), "x.zip")


def test_a_symlink_out_of_the_directory_is_refused(tmp_path):
    skill = tmp_path / "skill"
    (skill / "references").mkdir(parents=True)
    (skill / "SKILL.md").write_text("x")
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read")
    os.symlink(secret, skill / "references" / "leak.md")
    with pytest.raises(UserError, match="points outside the skill directory") as err:
        read_directory(skill)
    assert "references/leak.md" in str(err.value)
    (skill / "references" / "leak.md").unlink()
    os.symlink(tmp_path, skill / "up")
    with pytest.raises(UserError, match="outside"):
        read_directory(skill)


def test_symlinks_inside_the_directory_are_read_and_loops_refused(tmp_path):
    skill = tmp_path / "skill"
    (skill / "references").mkdir(parents=True)
    (skill / "SKILL.md").write_text("body")
    os.symlink(skill / "SKILL.md", skill / "references" / "same.md")
    tree = read_directory(skill)
    assert tree["references/same.md"] == tree["SKILL.md"]
    os.symlink(skill / "references", skill / "references" / "loop")
    with pytest.raises(UserError, match="loop"):
        read_directory(skill)


def test_clutter_is_skipped_on_disk(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_bytes(b"\x00")
    (tmp_path / ".DS_Store").write_bytes(b"\x00\x01")
    (tmp_path / "SKILL.md").write_text("x")
    assert list(read_directory(tmp_path)) == ["SKILL.md"]


def test_case_collisions_and_file_dir_clashes_are_refused():
    with pytest.raises(UserError, match="differ only in case"):
        SkillTree({"Notes.md": SkillFile(b"a"), "notes.md": SkillFile(b"b")})
    with pytest.raises(UserError, match="both as a file and as a directory"):
        SkillTree({"refs": SkillFile(b"a"), "refs/x.md": SkillFile(b"b")})


def test_a_linked_skill_directory_is_named_as_the_link(tmp_path):
    from skillstate.skilltree import load_skill

    source = tmp_path / "src" / "checkout"
    source.mkdir(parents=True)
    (source / "SKILL.md").write_text("---\nname: my-skill\ndescription: d\n---\n")
    (tmp_path / "skills").mkdir()
    os.symlink(source, tmp_path / "skills" / "my-skill")
    loaded = load_skill(tmp_path / "skills" / "my-skill")
    assert loaded.dir_name == "my-skill" and list(loaded.tree) == ["SKILL.md"]
