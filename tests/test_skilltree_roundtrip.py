"""A skill tree written out and read back is the same tree (directory and archive); its blob
encoding is canonical (insertion order does not matter, a known tree has a pinned hash); the
one-file case stays exactly today's markdown text."""

from __future__ import annotations

import hashlib
import io
import random
import uuid
import zipfile

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from skillstate.errors import CorruptLogError, UserError
from skillstate.skilltree import (
    SkillFile,
    SkillTree,
    archive_bytes,
    archive_tree,
    decode_tree,
    encode_tree,
    from_markdown,
    is_one_file,
    is_tree_blob,
    read_archive,
    read_directory,
    to_markdown,
    tree_blob,
    tree_hash,
    write_archive,
    write_directory,
)
from skillstate.skilltree.paths import path_problem
from skillstate.util import sha256_text

SEGMENT = st.text(alphabet=st.sampled_from("abcXYZ019-_. é日"), min_size=1, max_size=10).filter(
    lambda s: path_problem(s) is None)
PATH = st.lists(SEGMENT, min_size=1, max_size=3).map("/".join)
CONTENT = st.one_of(st.text(max_size=200).filter(lambda t: "\x00" not in t).map(lambda t: t.encode("utf-8")),
                    st.binary(max_size=200))
FILE = st.builds(SkillFile, CONTENT, st.booleans())


@st.composite
def trees(draw) -> SkillTree:
    files = draw(st.dictionaries(PATH, FILE, min_size=1, max_size=8))
    try:
        return SkillTree(files)
    except UserError:  # a case collision or a file that is also a directory
        assume(False)
        raise


TMP = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@TMP
@given(trees())
def test_directory_export_then_import_is_the_identity(tmp_path, tree):
    where = write_directory(tree, tmp_path / uuid.uuid4().hex / "my-skill")
    assert read_directory(where) == tree
    again = write_directory(tree, where, replace=True) if "SKILL.md" in tree else where
    assert read_directory(again) == tree


@settings(max_examples=80, deadline=None)
@given(trees())
def test_archive_export_then_import_is_the_identity(tree):
    data = archive_bytes(tree, "my-skill")
    assert archive_tree(data) == (tree, "my-skill")
    assert archive_bytes(tree, "my-skill") == data


@settings(max_examples=80, deadline=None)
@given(trees(), st.randoms(use_true_random=False))
def test_the_encoding_does_not_depend_on_insertion_order(tree, rnd):
    items = list(tree.items())
    rnd.shuffle(items)
    shuffled = SkillTree(dict(items))
    assert tree_blob(shuffled) == tree_blob(tree)
    assert tree_hash(shuffled) == tree_hash(tree)
    assert archive_bytes(shuffled, "s") == archive_bytes(tree, "s")
    encoded = encode_tree(tree)
    assert decode_tree(encoded.root, encoded.blobs) == tree
    assert all(sha256_text(text) == h for h, text in encoded.blobs.items())


def known_tree() -> SkillTree:
    return SkillTree({
        "SKILL.md": SkillFile(b"---\nname: demo\ndescription: A demo.\n---\n\nSee references/a.md.\n"),
        "references/a.md": SkillFile("Caf\u00e9 rules\r\n".encode()),
        "scripts/run.sh": SkillFile(b"#!/bin/sh\necho hi\n", executable=True),
        "assets/logo.bin": SkillFile(bytes(range(256))),
    })


def test_a_known_tree_has_a_pinned_encoding_and_hash():
    tree = known_tree()
    blob = tree_blob(tree)
    assert blob.startswith("\x00skillstate-tree/1\n{\"files\":{\"SKILL.md\":{\"blob\":")
    assert list(tree) == ["SKILL.md", "assets/logo.bin", "references/a.md", "scripts/run.sh"]
    entry = encode_tree(tree)
    assert "\"executable\":true" in blob and blob.count("\"kind\":\"binary\"") == 1
    assert tree["references/a.md"].sha256 == hashlib.sha256("Caf\u00e9 rules\r\n".encode()).hexdigest()
    assert entry.root_hash == tree_hash(tree) == PINNED_TREE_HASH


# Computed once, independently of skillstate (hashlib and json alone, as docs/agent-skills.md describes the
# encoding): a change to the encoding breaks every stored tree, so it must show here.
PINNED_TREE_HASH = "436d06107ddd47ab607b09a2115f0139f79a60f6df018f2ed57513caf4ed1061"


def test_the_one_file_case_is_the_markdown_itself():
    markdown = "# Question answering\n\nAnswer with one word.\n"
    tree = from_markdown(markdown)
    assert is_one_file(tree) and to_markdown(tree) == markdown
    encoded = encode_tree(tree)
    assert encoded.root == markdown and dict(encoded.blobs) == {sha256_text(markdown): markdown}
    assert tree_hash(tree) == sha256_text(markdown)  # what a run records for its skill today
    assert not is_tree_blob(markdown) and decode_tree(markdown, {}) == tree
    with pytest.raises(UserError, match="NUL"):
        from_markdown("\x00skillstate-tree/1\n{}")  # no markdown can pose as a tree
    two = tree.with_text("references/x.md", "more")
    assert not is_one_file(two) and is_tree_blob(encode_tree(two).root)
    with pytest.raises(UserError, match="not one markdown file: it holds references/x.md"):
        to_markdown(two)


def test_decoding_takes_a_lookup_function_and_refuses_damage():
    encoded = encode_tree(known_tree())
    asked: list[list[str]] = []

    def get_blobs(hashes: list[str]) -> dict[str, str]:
        asked.append(hashes)
        return {h: encoded.blobs[h] for h in hashes}

    assert decode_tree(encoded.root, get_blobs) == known_tree() and len(asked) == 1
    some = next(h for h in encoded.blobs if h != encoded.root_hash)
    with pytest.raises(CorruptLogError, match="missing"):
        decode_tree(encoded.root, {h: t for h, t in encoded.blobs.items() if h != some})
    with pytest.raises(CorruptLogError, match="does not match"):
        decode_tree(encoded.root, {**encoded.blobs, some: encoded.blobs[some] + "x"})
    with pytest.raises(CorruptLogError, match="unknown skill tree format"):
        decode_tree("\x00skillstate-tree/9\n{}", {})
    with pytest.raises(CorruptLogError, match="malformed"):
        decode_tree("\x00skillstate-tree/1\n{\"files\": 3}", {})


def test_archives_are_deterministic_and_install_under_their_name(tmp_path):
    tree = known_tree()
    out = write_archive(tree, tmp_path / "demo.skill", "demo")
    names = zipfile.ZipFile(out).namelist()
    assert names == sorted(names) and all(n.startswith("demo/") for n in names)
    assert {i.date_time for i in zipfile.ZipFile(out).infolist()} == {(1980, 1, 1, 0, 0, 0)}
    assert read_archive(out) == (tree, "demo")
    with pytest.raises(UserError, match="exists"):
        write_archive(tree, out, "demo")
    assert write_archive(tree, out, "demo", replace=True).read_bytes() == archive_bytes(tree, "demo")
    with pytest.raises(UserError, match=r"\.skill or \.zip"):
        write_archive(tree, tmp_path / "demo.tar", "demo")


def test_an_archive_with_skill_md_at_its_top_has_no_directory_name():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("./", "")
        archive.writestr("./SKILL.md", "x")
        archive.writestr("__MACOSX/._SKILL.md", "junk")
        archive.writestr("references/a.md", "y")
    tree, top = archive_tree(buffer.getvalue())
    assert top is None and list(tree) == ["SKILL.md", "references/a.md"]


def test_archive_limits(tmp_path):
    from skillstate.skilltree import Limits

    tree = SkillTree({f"f{i}.md": SkillFile(b"x" * 100) for i in range(5)})
    data = archive_bytes(tree, "s")
    with pytest.raises(UserError, match="more than 4 files"):
        archive_tree(data, "a.zip", Limits(max_files=4))
    with pytest.raises(UserError, match="unpacks to 100 B, more than a skill file may hold"):
        archive_tree(data, "a.zip", Limits(max_file_bytes=99))
    with pytest.raises(UserError, match="unpacks to more than 300 B"):
        archive_tree(data, "a.zip", Limits(max_total_bytes=300))
    bomb = archive_bytes(SkillTree({"zeros.bin": SkillFile(bytes(20_000_000))}), "s")
    assert len(bomb) < 100_000
    with pytest.raises(UserError, match="more than a skill file may hold"):
        archive_tree(bomb, "bomb.zip")
    with pytest.raises(UserError, match="not a readable zip archive"):
        archive_tree(b"PK\x03\x04 not really", "bad.skill")


def test_writing_a_directory_never_clobbers(tmp_path):
    tree = known_tree()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not empty"):
        write_directory(tree, tmp_path / "full")
    with pytest.raises(UserError, match="holds no SKILL.md, so it is not replaced"):
        write_directory(tree, tmp_path / "full", replace=True)
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    assert read_directory(write_directory(tree, tmp_path / "empty")) == tree
    smaller = tree.without("assets/logo.bin")
    assert read_directory(write_directory(smaller, tmp_path / "empty", replace=True)) == smaller
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "full"]  # no staging left behind


def test_tree_values_are_immutable_and_edits_make_new_trees():
    tree = known_tree()
    edited = tree.with_text("references/a.md", "new")
    assert tree["references/a.md"].text == "Café rules\r\n" and edited["references/a.md"].text == "new"
    assert edited.with_text("scripts/run.sh", "echo\n")["scripts/run.sh"].executable
    with pytest.raises(UserError, match="binary assets are never edited"):
        tree.with_text("assets/logo.bin", "text")
    with pytest.raises(TypeError):
        tree["x"] = SkillFile(b"")  # type: ignore[index]
    assert len({tree, known_tree()}) == 1
    rnd = random.Random(0)
    assert SkillTree(sorted(tree.items(), key=lambda _: rnd.random())) == tree


def test_a_tampered_tree_blob_with_a_hostile_path_is_corrupt():
    encoded = encode_tree(known_tree())
    evil = encoded.root.replace('"references/a.md"', '"../a.md"')
    with pytest.raises(CorruptLogError, match="holds what no tree may"):
        decode_tree(evil, encoded.blobs)
