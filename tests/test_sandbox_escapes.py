"""A hostile agent against the sandbox, the check and verification (issue 39): each escape that got through
once, tried again. CI runs as root, the case that matters most: there the driver drops to an unprivileged user
before the command's own user namespace is made. The end-to-end hostile agent, run by the `command` harness
through the proxy, is tests/test_hostile_agent.py."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from skillstate.envs.registry import apply_settings, env_settings, resolve_env
from skillstate.envs.run_paths import name_run_paths
from skillstate.envs.workspace.cgroups import make_group
from skillstate.envs.workspace.check_report import expected_tests, junit_verdict
from skillstate.envs.workspace.checking import SANDBOX_ROOT, outcome_of
from skillstate.envs.workspace.external import SHOWN_PATHS, check_recorded
from skillstate.envs.workspace.files import diff_of, snapshot
from skillstate.envs.workspace.harness import HarnessSettings
from skillstate.envs.workspace.sandbox import SandboxSettings, run_command
from skillstate.envs.workspace.tasks import bundled_tasks
from skillstate.envs.workspace.workspace_record import record_workspace

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (.ci/run installs it)")
ROOT_DRIVER = os.geteuid() == 0
FAST = SandboxSettings(wall_seconds=20, max_processes=64)
MB = 1024 * 1024


def build(**env_config):
    from conftest import small_config

    cls = resolve_env("workspace")
    env = cls(cls.builtin_splits(env_settings(cls, env_config, "workspace"), ["train", "val", "test"]),
              env_settings(cls, env_config, "workspace"))
    apply_settings(env, small_config(env="workspace"))
    return env


def sh(command: str, workspace: Path, settings: SandboxSettings = FAST, **kw) -> str:
    return run_command(command, workspace, settings, SANDBOX_ROOT, **kw).output


# --- 1. the machine's settings, root-only files and the sandbox's own user --------------------------------------

def test_the_command_is_an_unprivileged_user_that_cannot_touch_the_kernels_settings(tmp_path):
    swappiness = Path("/proc/sys/vm/swappiness").read_text()
    out = sh("id -u; echo 1 > /proc/sys/vm/swappiness && echo WROTE-SWAPPINESS; "
             "echo '|/tmp/x' > /proc/sys/kernel/core_pattern && echo WROTE-CORE; "
             "echo h > /proc/sysrq-trigger && echo WROTE-SYSRQ; cat /etc/shadow && echo READ-SHADOW; "
             "unshare -U true && echo NESTED-USERNS; touch mine", tmp_path)
    assert "WROTE" not in out and "READ-SHADOW" not in out and "NESTED-USERNS" not in out, out
    assert out.splitlines()[0] == "1000"  # inside its own user namespace
    assert Path("/proc/sys/vm/swappiness").read_text() == swappiness
    owner = os.lstat(tmp_path / "mine").st_uid  # on the host, what it made is an unprivileged user's
    assert owner != 0 and owner == (FAST.run_as if ROOT_DRIVER else os.geteuid())


def test_the_sandboxs_first_process_and_mounts_do_not_name_the_workspaces_host_folder():
    env = build()
    with env.workspace() as box:
        out = sh("cat /proc/1/cmdline | tr '\\0' ' '; echo; cat /proc/self/mountinfo", box.root)
        assert str(box.folder) not in out, out
        if not ROOT_DRIVER:  # an ordinary user's workspace is a plain folder: its bind names it in mountinfo
            pytest.skip("only a root driver's workspace is a file system of its own")


# --- 2. the view is an allow-list: nothing the run names, nothing of the machine it does not need -----------------

def test_the_runs_own_files_and_the_machines_private_folders_are_not_there(tmp_path):
    shown = tmp_path / "agent-home"  # a folder the harness shows (`harness.show`), holding the run's own files
    (shown / "data").mkdir(parents=True)
    (shown / "data" / "val.jsonl").write_text('{"id": "v1", "solution": "THE-ANSWER"}\n')
    (shown / "runs.db").write_text("OTHER-RUNS-LOG")
    (shown / "run.yaml").write_text("api_key_env: SECRET-CONFIG")
    (shown / "tool.py").write_text("print('a tool the agent needs')\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("NOT-FOR-AGENTS")
    name_run_paths([shown / "data", shown / "runs.db", shown / "run.yaml"])
    workspace = tmp_path / "ws"
    workspace.mkdir()
    out = sh(f"cat {shown}/data/val.jsonl {shown}/runs.db {shown}/run.yaml {elsewhere}/notes.txt; "
             f"python {shown}/tool.py; ls / /home /root /var /run /srv /mnt {Path.cwd()} 2>&1 | head -40",
             workspace, shown=[str(shown)])
    for secret in ("THE-ANSWER", "OTHER-RUNS-LOG", "SECRET-CONFIG", "NOT-FOR-AGENTS"):
        assert secret not in out, out
    assert "a tool the agent needs" in out  # what the harness shows is there
    assert "var" not in out.split("/home")[0].split() and "run" not in out.split("/home")[0].split(), out


def test_skillstates_own_package_is_never_shown(tmp_path):
    import skillstate

    package = Path(skillstate.__file__).parent
    tasks = package / "envs" / "workspace" / "tasks.py"
    out = sh(f"cat {tasks} | head -3; python -c 'import skillstate' 2>&1 | tail -1", tmp_path,
             shown=[str(package.parent)])
    assert "bundled" not in out and ("No module named" in out or "Error" in out), out


# --- 3. a check must prove that it ran -------------------------------------------------------------------------

def test_code_that_ends_pytest_early_with_exit_code_0_fails_the_check_and_its_verification():
    env = build()
    item = bundled_tasks()[1]  # money: pytest on tests/test_<name>.py
    for hack in ("import os\nos._exit(0)\n", "import sys\nsys.exit(0)\n",
                 "import pytest\npytest.skip('no', allow_module_level=True)\n"):
        result = env.check_solution(item, {"tally/money.py": hack})
        assert not result["passed"] and outcome_of(result, "")[0] == 0.0, result
    assert env.check_solution(item, item["solution"])["passed"]


def test_the_check_files_cannot_be_rewritten_by_the_code_under_test():
    env = build()
    item = bundled_tasks()[1]
    rewrite = ("import glob\nfor f in glob.glob('tests/*.py'):\n    try:\n"
               "        open(f, 'w').write('def test_ok():\\n    pass\\n')\n    except OSError:\n        pass\n")
    result = env.check_solution(item, {"tally/__init__.py": rewrite})
    assert not result["passed"], result


def test_a_junit_report_must_name_every_test_of_the_checks_files():
    files = {"tests/test_a.py": "def test_one():\n    pass\n\n\nclass TestB:\n    def test_two(self):\n        pass\n"}
    assert expected_tests(files) == {"test_a::test_one", "test_a::TestB.test_two"}
    both = (b'<testsuites><testsuite><testcase classname="tests.test_a" name="test_one"/>'
            b'<testcase classname="tests.test_a.TestB" name="test_two"/></testsuite></testsuites>')
    assert junit_verdict(both, expected_tests(files)).passed
    one = b'<testsuites><testsuite><testcase classname="tests.test_a" name="test_one"/></testsuite></testsuites>'
    said = junit_verdict(one, expected_tests(files))
    assert not said.passed and "never ran" in said.summary and said.soft == 0.5
    assert not junit_verdict(b"", set()).passed and not junit_verdict(b"<x/>", set()).passed


# --- 6. limits that hold ---------------------------------------------------------------------------------------

def test_the_private_folders_are_bounded_in_size(tmp_path):
    # du -x: the private folder's own file system, not what is mounted below it (the workspace at /tmp/workspace,
    # or a Python found under /tmp when the project itself lives there)
    out = sh("for i in 1 2 3; do head -c 40M /dev/zero > /tmp/f$i; done; du -sxm /tmp | cut -f1; "
             "head -c 40M /dev/zero > /dev/shm/g 2>&1; du -sxm /dev/shm | cut -f1",
             tmp_path, FAST.model_copy(update={"tmp_mb": 64}))
    assert "No space left on device" in out, out
    sizes = [int(x) for x in out.split() if x.isdigit()]
    assert sizes and max(sizes) <= 65, out  # du rounds up


def can_make_groups() -> bool:
    group = make_group(16, 64 * MB)
    if group is None:
        return False
    group.drop()
    return group.memory is not None


@pytest.mark.skipif(not can_make_groups(), reason="needs a memory cgroup the driver can make (root)")
def test_memory_counts_what_the_command_keeps_in_its_in_memory_folders(tmp_path):
    settings = FAST.model_copy(update={"memory_mb": 128, "tmp_mb": 1024})
    result = run_command("for i in 1 2 3 4 5 6 7 8; do head -c 50M /dev/zero > /tmp/fill$i; done; echo STILL-HERE",
                         tmp_path, settings, SANDBOX_ROOT)
    assert result.limit == "memory" and "STILL-HERE" not in result.output, result
    assert "128 MB of memory" in result.summary()


def test_the_agents_memory_default_fits_the_machine():
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert HarnessSettings().memory_mb * MB < total and SandboxSettings().memory_mb * MB < total


def test_a_workspace_that_grows_past_its_bound_ends_the_rollout():
    env = build(sandbox={"workspace_mb": 64, "wall_seconds": 30})
    with env.workspace() as box:
        ended: list[str] = []
        out, _invalid = env._act(box.root, "run", json.dumps(
            {"command": "for i in 1 2 3; do head -c 50M /dev/zero > big$i; done; echo done"}), box, ended)
        assert ended and "64 MB" in ended[0], (out, ended)
        assert box.used() <= 64 * MB + 50 * MB  # a mount never passes it; a watch stops within a look
        hard, _soft, reason, _diff, _check = env.judge(box.root, bundled_tasks()[0], f"sandbox_limit: {ended[0]}")
        assert hard == 0.0 and reason.startswith("sandbox_limit")


# --- 7 and 9. verification agrees with every honest rollout ------------------------------------------------------

def recorded(root: Path, item: dict, reason: str = "", limit: int = 64 * MB):
    """A harness trajectory of the workspace at `root`, as external_rollout records it, and its event's result
    and what the agent left (the check's files are in `root` after)."""
    env = build()
    before = snapshot(root)
    record = record_workspace(root, item["files"], limit)
    hard, soft, kept, diff, check = env.judge(root, item, reason)
    trajectory = {"item_id": item["id"], "exchanges": [], "diff": diff, "workspace": record.hash,
                  "workspace_bytes": record.size, "final_files_complete": record.complete, "check": check,
                  "changed_files": record.changed[:SHOWN_PATHS]}
    return env, trajectory, SimpleNamespace(calls=[], fail_reason=kept, hard=hard), record, before


def workspace_of(tmp_path: Path, item: dict, extra: dict[str, str] | None = None) -> Path:
    root = tmp_path / "ws"
    for path, text in {**item["files"], **item["solution"], **(extra or {})}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


@pytest.mark.parametrize("reason", ["harness_timeout: the agent ran past 2 s", "harness_failed: exit code 3: boom"])
def test_verify_agrees_with_an_agent_that_stopped_badly_but_left_passing_code(tmp_path, reason):
    item = bundled_tasks()[1]
    env, trajectory, result, record, before = recorded(workspace_of(tmp_path, item), item, reason)
    assert result.hard == 0.0 and trajectory["check"]["passed"]
    assert check_recorded(env, item, trajectory, result, record.blobs.__getitem__) is None


def test_verify_rebuilds_symlinks_odd_names_deep_paths_binary_and_large_files(tmp_path):
    item = bundled_tasks()[1]
    root = workspace_of(tmp_path, item, {"NUL": "x", "a?b": "y", "x:y.txt": "z",
                                         "/".join(["d"] * 40) + "/deep.txt": "deep",
                                         "data/big.txt": "0123456789\n" * 300_000})  # 3.3M characters
    (root / "link").symlink_to("tally/money.py")
    (root / "outside").symlink_to("/etc/passwd")
    (root / "bin.dat").write_bytes(bytes(range(256)))
    (root / os.fsdecode(b"caf\xe9")).write_text("not UTF-8 in its name")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / "empty").mkdir()
    env, trajectory, result, record, before = recorded(root, item)
    assert record.complete and result.hard == 1.0
    assert check_recorded(env, item, trajectory, result, record.blobs.__getitem__) is None
    rebuilt = tmp_path / "rebuilt"
    rebuilt.mkdir()
    from skillstate.envs.workspace.workspace_record import rebuild

    rebuild(rebuilt, item["files"], record.manifest, record.blobs.__getitem__)
    assert os.readlink(rebuilt / "link") == "tally/money.py" and (rebuilt / "bin.dat").read_bytes() == bytes(range(256))
    assert os.access(rebuilt / "run.sh", os.X_OK) and (rebuilt / "empty").is_dir()
    assert snapshot(rebuilt) == before


def test_file_names_count_against_the_records_bound(tmp_path):
    item = bundled_tasks()[1]
    root = workspace_of(tmp_path, item)
    many = root / "many"
    many.mkdir()
    for n in range(4000):
        (many / (f"{n:05d}" + "n" * 235)).write_text("")
    env, trajectory, result, record, before = recorded(root, item, limit=512 * 1024)
    assert not record.complete and record.size > 512 * 1024  # 4,000 names of 240 characters: about 1 MB
    assert len(json.dumps(trajectory)) < 100_000  # the trajectory names the record, it does not hold it
    problem = check_recorded(env, item, trajectory, result, record.blobs.__getitem__)
    assert problem is not None and "max_record_mb" in problem
    assert diff_of(item["files"], before, 20_000) == trajectory["diff"]


def test_the_sandbox_still_runs_pythons_tools(tmp_path):
    out = sh(f"{sys.executable} -c 'import pytest, json; print(\"ok\")'; python -m pytest --version", tmp_path)
    assert "ok" in out and "pytest" in out, out


# --- found in review: what an agent shapes never stops the run, never scores another rollout --------------------

def deep_tree(root: Path, depth: int = 1500) -> None:
    here = os.open(root, os.O_RDONLY)
    for _ in range(depth):  # relative to a folder's descriptor: no path of the driver's grows past its limit
        os.mkdir("d", dir_fd=here)
        nxt = os.open("d", os.O_RDONLY, dir_fd=here)
        os.close(here)
        here = nxt
    os.close(here)


def test_a_tree_nested_past_the_bound_ends_the_rollout_and_is_not_read(tmp_path):
    env = build()
    item = bundled_tasks()[1]
    with env.workspace() as box:
        for path, text in item["files"].items():
            (box.root / path).parent.mkdir(parents=True, exist_ok=True)
            (box.root / path).write_text(text)
        deep_tree(box.root)
        hard, _soft, reason, diff, check = env.judge(box.root, item, "", box)
        assert hard == 0.0 and reason.startswith("sandbox_limit") and "deep" in reason, reason
        assert diff.startswith("(not read") and check["result"].startswith("not run")
    from skillstate.envs.workspace.workspace_scan import remove_tree

    (tmp_path / "x").mkdir()
    deep_tree(tmp_path / "x")
    remove_tree(tmp_path / "x")  # however deep
    assert not (tmp_path / "x").exists()


def test_what_an_agent_prints_or_sends_nested_deep_is_clipped_or_refused():
    from skillstate.envs.workspace.harness import read_events
    from skillstate.envs.workspace.proxy.protocols import CHAT
    from skillstate.envs.workspace.proxy.server import AgentProxy

    events, _log = read_events("[" * 900 + "]" * 900 + '\n{"type": "ok"}\n')
    assert events[-1] == {"type": "ok"} and "clipped" in events[0]
    deep: dict = {}
    cur = deep
    for _ in range(900):
        cur["p"] = {}
        cur = cur["p"]

    def complete(messages, tools=None):
        raise AssertionError("a request nested this deep is never sent")

    proxy = AgentProxy(complete)
    code, body = proxy.answer(CHAT, {"messages": [{"role": "user", "content": "hi"}],
                                     "tools": [{"type": "function", "function": {"name": "t", "parameters": deep}}]})
    assert code == 400 and "deep" in json.dumps(body)
    assert proxy.raised is None


def test_the_checks_cache_sees_every_byte_and_mode(tmp_path):
    env = build()
    item = bundled_tasks()[1]
    with env.workspace() as box:
        for path, text in {**item["files"], **item["solution"]}.items():
            (box.root / path).parent.mkdir(parents=True, exist_ok=True)
            (box.root / path).write_text(text)
        (box.root / "tally" / "money.py").chmod(0)  # the right code, unreadable: this rollout fails
        hostile = env._check(box.root, item, box)
        (box.root / "tally" / "money.py").chmod(0o644)  # an honest rollout that left the same text
        honest = env._check(box.root, item, box)
    assert not hostile["passed"] and honest["passed"], (hostile, honest)


def test_a_planted_compiled_cache_never_runs_in_the_check():
    import py_compile

    env = build()
    item = bundled_tasks()[1]
    case = '<testcase classname="tests.test_percent_of" name="test_percent_of"/>'
    forged = (f"import os\nopen('/tmp/.skillstate-check/report', 'w').write("
              f"'<testsuites><testsuite>{case}</testsuite></testsuites>')\nos._exit(0)\n")
    with env.workspace() as box:
        for path, text in item["files"].items():
            (box.root / path).parent.mkdir(parents=True, exist_ok=True)
            (box.root / path).write_text(text)
        source = box.root / "forged.py"
        source.write_text(forged)
        cache = box.root / "tally" / "__pycache__"
        cache.mkdir()
        py_compile.compile(str(source), cfile=str(cache / f"money.{sys.implementation.cache_tag}.pyc"),
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        source.unlink()
        hard, _soft, _reason, diff, check = env.judge(box.root, item, "", box)
    assert hard == 0.0 and not check["passed"] and diff == "", check


def test_sparse_files_are_looked_at_not_read():
    env = build(sandbox={"workspace_mb": 64})
    item = bundled_tasks()[1]
    with env.workspace() as box:
        for n in range(3):
            with open(box.root / f"sparse{n}", "wb") as f:
                f.truncate(50 * 1024 * MB)  # 50 GB each, no block on the disk
        assert "add up to more than" in (box.problem() or "")
        record = record_workspace(box.root, item["files"], 64 * MB)
        assert not record.complete and len(record.manifest) < 1000
        hard, _soft, reason, _diff, _check = env.judge(box.root, item, "", box)
        assert hard == 0.0 and reason.startswith("sandbox_limit")


def test_a_workspace_with_too_many_files_ends_the_rollout_and_list_files_is_clipped():
    env = build(sandbox={"workspace_files": 500, "wall_seconds": 30})
    with env.workspace() as box:
        ended: list[str] = []
        env._act(box.root, "run", json.dumps({"command": "mkdir many && cd many && seq 1 800 | xargs touch"}),
                 box, ended)
        assert ended and "500" in ended[0], ended
    env = build()
    with env.workspace() as box:
        (box.root / "many").mkdir()
        for n in range(2500):
            (box.root / "many" / str(n)).write_text("")
        listed, _invalid = env._act(box.root, "list_files", "{}")
        assert listed.count("\n") <= 2001 and listed.endswith("and 500 more files")


def test_what_a_check_writes_to_its_report_folder_is_bounded():
    env = build(sandbox={"wall_seconds": 30})
    item = {**bundled_tasks()[1], "check": "for i in 1 2 3; do head -c 10M /dev/zero > /tmp/.skillstate-check/f$i; "
                                           "done; echo '{\"passed\": true}' > {report}", "check_report": "json"}
    result = env.check_solution(item, item["solution"])
    assert not result["passed"], result


def test_a_dead_drivers_leftovers_are_swept(tmp_path):
    import subprocess
    import tempfile

    from skillstate.envs.workspace import workspace_dir as wd

    dead = subprocess.Popen(["true"])
    dead.wait()
    base = Path(tempfile.gettempdir())
    left = [base / f"skillstate-check-{dead.pid}-x", base / f"skillstate-ws-{dead.pid}-y",
            Path(f"/tmp/ss-{dead.pid}-z")]
    for folder in left:
        (folder / "workspace").mkdir(parents=True)
    group = make_group(16, 64 * MB)
    if group is not None:  # a group named as a dead driver's
        for d in group.dirs:
            d.rename(d.parent / f"skillstate-{dead.pid}-1")
    wd._swept.clear()
    wd.sweep_orphans()
    assert not any(folder.exists() for folder in left)
    if group is not None:
        assert not any((d.parent / f"skillstate-{dead.pid}-1").exists() for d in group.dirs)


def test_verify_rebuilds_every_permission_bit(tmp_path):
    item = bundled_tasks()[1]
    root = workspace_of(tmp_path, item)
    (root / "tally" / "money.py").chmod(0o600)
    (root / "secret.txt").write_text("x")
    (root / "secret.txt").chmod(0o000)
    env, trajectory, result, record, _before = recorded(root, item)
    assert check_recorded(env, item, trajectory, result, record.blobs.__getitem__) is None
    modes = {json.dumps(f["path"]): f["mode"] for f in json.loads(record.manifest.split("\n", 1)[1])["files"]}
    assert modes['"secret.txt"'] == 0 and modes['"tally/money.py"'] == 0o600


def test_a_content_length_of_unicode_digits_is_no_length():
    import socket

    from skillstate.envs.workspace.proxy.server import AgentProxy

    def complete(messages, tools=None):
        raise AssertionError("never sent")

    def agent() -> bytes:
        host, port = proxy.base_url.split("//")[1].split("/")[0].split(":")
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer {proxy.key}\r\n"
                         "Content-Length: \u00b2\r\n\r\n".encode())
            return conn.recv(200)

    with AgentProxy(complete) as proxy:
        reply = proxy.run_while(agent)  # an empty body: a request with no messages, refused
    assert reply.startswith(b"HTTP/1.") and b" 400 " in reply.split(b"\r\n")[0], reply
