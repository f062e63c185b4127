"""The built-in sql environment and its bundled ISO countries data."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from skillstate.envs.registry import env_settings, resolve_env
from skillstate.envs.sql import DEFAULT_DATABASE, STEP_LIMIT, SqlConfig, SqlEnv, check_select
from skillstate.envs.tools import ToolError
from skillstate.errors import ConfigError

SPLITS = ["train", "val", "test"]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module", autouse=True)
def database_unchanged():
    """No test may change the bundled database (it is opened read-only)."""
    before = _digest(DEFAULT_DATABASE)
    yield
    assert _digest(DEFAULT_DATABASE) == before
    assert not Path(f"{DEFAULT_DATABASE}-journal").exists() and not Path(f"{DEFAULT_DATABASE}-wal").exists()


@pytest.fixture(scope="module")
def env() -> SqlEnv:
    splits = SqlEnv.builtin_splits(SqlConfig(), SPLITS)
    assert splits is not None
    return SqlEnv(splits, SqlConfig())


def _query(env: SqlEnv, query: str) -> dict:
    return json.loads(env.call_tool({}, "sql", {"query": query}))


def test_bundled_splits(env):
    assert {name: len(items) for name, items in env.splits.items()} == {"train": 60, "val": 30, "test": 30}
    types = {item["task_type"] for items in env.splits.values() for item in items}
    assert types == {"lookup", "reverse_lookup", "count", "currency", "aggregate"}
    for item in env.items("train"):
        assert item["answers"] and item["sql"] and item["question"]


def test_splits_follow_the_requested_names():
    splits = SqlEnv.builtin_splits(SqlConfig(), ["a", "b", "c"])
    assert splits is not None and [len(splits[k]) for k in "abc"] == [60, 30, 30]
    assert SqlEnv.builtin_splits(SqlConfig(database=str(DEFAULT_DATABASE)), SPLITS) is not None


def test_another_database_has_no_builtin_splits(tmp_path):
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    assert SqlEnv.builtin_splits(SqlConfig(database=str(other)), SPLITS) is None
    env = SqlEnv({}, SqlConfig(database=str(other)))
    assert "CREATE TABLE t (x);" in env.call_tool({}, "schema", {})


def test_registry_and_config():
    cls = resolve_env("sql")
    assert cls is SqlEnv
    assert env_settings(cls, {}, "sql").model_dump() == {"database": None, "row_limit": 20}
    with pytest.raises(ConfigError, match="no such setting"):
        env_settings(cls, {"rows": 3}, "sql")
    with pytest.raises(ConfigError, match="not a file"):
        env_settings(cls, {"database": "/nonexistent/x.sqlite"}, "sql")


def test_every_reference_query_gives_the_first_answer(env):
    for items in env.splits.values():
        for item in items:
            result = _query(env, item["sql"])
            assert result["columns"] and len(result["columns"]) == 1, item["id"]
            assert result["row_count"] == len(result["rows"]) == 1, item["id"]
            assert str(result["rows"][0][0]) == item["answers"][0], item["id"]
            assert env.score(item["answers"][0], item)[0] == 1.0


def test_result_shape_and_row_limit(env):
    out = env.call_tool({}, "sql", {"query": "SELECT alpha_2, name FROM countries WHERE alpha_2 = 'FR'"})
    assert out == '{"columns": ["alpha_2", "name"], "rows": [["FR", "France"]], "row_count": 1}'
    result = _query(env, "SELECT code FROM subdivisions")
    assert result["row_count"] == len(result["rows"]) == 20 and result["truncated"] is True
    assert "truncated" not in _query(env, "SELECT code FROM subdivisions LIMIT 20")
    small = SqlEnv({}, SqlConfig(row_limit=3))
    assert len(_query(small, "SELECT * FROM countries")["rows"]) == 3
    assert _query(env, "SELECT name FROM countries WHERE alpha_2 = 'AX'")["rows"] == [["Åland Islands"]]
    assert "Åland" in env.call_tool({}, "sql", {"query": "SELECT name FROM countries WHERE alpha_2 = 'AX'"})


def test_with_statements_comments_and_trailing_semicolons_run(env):
    result = _query(env, "-- a comment\n/* and another */ WITH c AS (SELECT COUNT(*) AS n FROM currencies) "
                         "SELECT n FROM c;")
    assert result["rows"] == [[178]]
    assert _query(env, "select count(*) from countries ;  ")["rows"] == [[249]]


@pytest.mark.parametrize("query", [
    "DELETE FROM countries",
    "UPDATE countries SET name = 'x'",
    "INSERT INTO countries (alpha_2) VALUES ('ZZ')",
    "DROP TABLE countries",
    "CREATE TABLE x (y)",
    "ATTACH DATABASE ':memory:' AS other",
    "ATTACH DATABASE 'file:/tmp/skillstate-sql-test.db' AS other",
    "PRAGMA table_info(countries)",
    "VACUUM",
    "",
    "   ;  ",
    "-- only a comment",
    "SELECT 1; DELETE FROM countries",
    "SELECT 1; SELECT 2",
    "WITH x AS (SELECT 1) DELETE FROM countries",
    "SELECT * FROM pragma_table_info('countries')",
    "SELECT load_extension('x')",
])
def test_only_a_single_select_runs(env, query):
    with pytest.raises(ToolError):
        env.call_tool({}, "sql", {"query": query})
    assert _query(env, "SELECT COUNT(*) FROM countries")["rows"] == [[249]]


def test_refusal_messages(env):
    with pytest.raises(ToolError, match="only a single read-only SELECT .*; got a DELETE statement"):
        env.call_tool({}, "sql", {"query": "DELETE FROM countries"})
    with pytest.raises(ToolError, match="one statement at a time"):
        env.call_tool({}, "sql", {"query": "SELECT 1; SELECT 2"})
    with pytest.raises(ToolError, match="query"):
        env.call_tool({}, "sql", {})
    with pytest.raises(ToolError, match="no tool"):
        env.call_tool({}, "drop", {})


def test_check_select():
    assert check_select("  SELECT 1 ;; ") == "SELECT 1"
    assert check_select("with x as (select 1) select * from x") == "with x as (select 1) select * from x"
    with pytest.raises(ToolError):
        check_select("EXPLAIN SELECT 1")


def test_sqlite_errors_are_tool_errors(env):
    with pytest.raises(ToolError, match="no such table"):
        env.call_tool({}, "sql", {"query": "SELECT * FROM country"})
    with pytest.raises(ToolError, match="no such column"):
        env.call_tool({}, "sql", {"query": "SELECT population FROM countries"})
    with pytest.raises(ToolError, match="syntax error"):
        env.call_tool({}, "sql", {"query": "SELECT name FROM countries WHERE WHERE"})


def test_a_runaway_query_is_stopped(env):
    query = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n"
    with pytest.raises(ToolError, match="too long"):
        env.call_tool({}, "sql", {"query": query})
    assert STEP_LIMIT > 0


def test_schema_tool(env):
    schema = env.call_tool({}, "schema", {})
    for table in ("countries", "subdivisions", "currencies", "languages"):
        assert f"CREATE TABLE {table}" in schema
    assert "sqlite_" not in schema


def test_concurrent_calls(env):
    items = [item for items in env.splits.values() for item in items]

    def run(n: int) -> bool:
        for item in items[n::8]:
            result = _query(env, item["sql"])
            if str(result["rows"][0][0]) != item["answers"][0]:
                return False
        try:
            env.call_tool({}, "sql", {"query": "DELETE FROM countries"})
        except ToolError:
            pass
        env.call_tool({}, "schema", {})
        return True

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(run, range(8)))


def test_tools_task_message_and_skill(env):
    item = env.items("train")[0]
    tools = env.tools(item)
    assert [t["function"]["name"] for t in tools] == ["sql", "schema"]
    assert tools[0]["function"]["parameters"]["required"] == ["query"]
    assert "read-only" in tools[0]["function"]["description"] and "JSON" in tools[0]["function"]["description"]
    message = env.task_message(item)
    assert message.startswith(item["question"]) and message.endswith("Answer with the value only.")
    assert item["sql"] not in message
    skill = env.default_skill()
    assert skill.startswith("# Database assistant")
    assert "- Answer from memory when you are confident; tools are slow." in skill


def test_score(env):
    item = {"id": "x", "question": "Which country has the ISO 3166-1 alpha-2 code 'VN'?",
            "answers": ["Viet Nam", "Vietnam"], "sql": "SELECT name FROM countries WHERE alpha_2 = 'VN'"}
    assert env.score("Viet Nam", item)[0] == 1.0
    assert env.score("Vietnam.", item)[0] == 1.0
    hard, soft, reason = env.score("Laos", item)
    assert hard == 0.0 and reason.startswith("wrong_answer")
