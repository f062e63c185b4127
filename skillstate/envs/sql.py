"""A tool-using environment over a read-only SQLite database.

The target answers a question by querying the database through two tools:
`schema` (the CREATE TABLE statements) and `sql` (one read-only SELECT,
returned as JSON). Its final answer is scored like question answering
(`skillstate.envs.qa.score_answer`).

By default the database is the bundled `data/countries/countries.sqlite`:
real ISO 3166-1 countries, ISO 3166-2 subdivisions, ISO 4217 currencies and
ISO 639-1 languages from the Debian iso-codes data (via the pycountry
package, LGPL), with 120 questions in train/val/test splits. Both are built
by `examples/sql_tool/build_data.py`.

`env_config`: `database` (another SQLite file; then the run names its `data`
directory of items) and `row_limit` (the most rows one query returns).
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from skillstate.envs.qa import QAItem, _read_items, score_answer
from skillstate.envs.tools import ToolEnv, ToolError

DATA_DIR = Path(__file__).resolve().parent / "data" / "countries"
DEFAULT_DATABASE = DATA_DIR / "countries.sqlite"
SPLIT_FILES = ("train.jsonl", "val.jsonl", "test.jsonl")

# A query may run this many SQLite virtual-machine instructions (about a
# second or two); a count, not a clock, so that a query is stopped the same
# way on every machine and a replayed run sees the same tool output.
STEP_LIMIT = 50_000_000
_PROGRESS_EVERY = 10_000

DEFAULT_SKILL = """# Database assistant

- The facts you need are in the database; look at its schema before you query it.
- Answer from memory when you are confident; tools are slow.
- Give the final answer exactly as the database has it.
"""

_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_LEADING_COMMENTS = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/)*", re.DOTALL)
_FIRST_WORD = re.compile(r"[A-Za-z]+")


class SqlConfig(BaseModel):
    """The `env_config` of the sql environment."""

    model_config = ConfigDict(extra="forbid")

    database: str | None = Field(
        None, description="SQLite file the tools query (opened read-only); default: the bundled ISO countries "
                          "database, with its bundled question splits.")
    row_limit: int = Field(20, ge=1, le=10_000, description="The most rows one query returns.")

    @field_validator("database")
    @classmethod
    def _exists(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).expanduser().is_file():
            raise ValueError(f"database {v} is not a file")
        return v


class SqlItem(QAItem):
    """A question over the database (a QA item's fields). `sql` is the
    reference query the answers were computed from; it is never shown to the
    target."""

    sql: str


def _is_default(database: str | None) -> bool:
    return database is None or Path(database).expanduser().resolve() == DEFAULT_DATABASE


def _authorize(action: int, *_: Any) -> int:
    """Let a statement read and compute, nothing else (no writes, ATTACH or PRAGMA)."""
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    return value


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def check_select(query: str) -> str:
    """The query without trailing semicolons, if it is a SELECT or WITH
    statement; a ToolError otherwise. (sqlite3 itself refuses a second
    statement, and the authorizer anything that is not a read.)"""
    body = query.strip().rstrip(";").rstrip()
    rest = body[_LEADING_COMMENTS.match(body).end():]  # type: ignore[union-attr]  # the pattern always matches
    word = _FIRST_WORD.match(rest)
    if not rest or word is None or word.group(0).upper() not in ("SELECT", "WITH"):
        shown = f"a {word.group(0).upper()} statement" if word else repr(rest[:20]) if rest else "an empty query"
        raise ToolError(f"only a single read-only SELECT (or WITH ... SELECT) statement may run; got {shown}")
    return body


class SqlEnv(ToolEnv):
    kind = "sql"
    item_model = SqlItem
    config_model = SqlConfig

    def __init__(self, splits: dict[str, list[dict[str, Any]]], config: BaseModel | None = None):
        super().__init__(splits, config)
        cfg = self.config if isinstance(self.config, SqlConfig) else SqlConfig.model_validate(self.config.model_dump())
        self.database = Path(cfg.database).expanduser().resolve() if cfg.database else DEFAULT_DATABASE
        self.row_limit = cfg.row_limit
        self._uri = f"{self.database.as_uri()}?mode=ro"
        self._schema: str | None = None

    @classmethod
    def builtin_splits(cls, config: BaseModel, splits: list[str]) -> dict[str, list[dict[str, Any]]] | None:
        if not _is_default(getattr(config, "database", None)):
            return None
        pairs = zip(splits, SPLIT_FILES, strict=False)  # the first three names: train, val, test
        return {name: _read_items(DATA_DIR / file, cls.item_model) for name, file in pairs}

    def default_skill(self) -> str:
        return DEFAULT_SKILL

    def tools(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {"type": "function", "function": {
                "name": "sql",
                "description": ("Run one read-only SQLite query (a single SELECT or WITH statement) over the "
                                "database and return the result as JSON: {\"columns\": [...], \"rows\": [[...], "
                                f"...], \"row_count\": N}}. At most {self.row_limit} rows are returned; "
                                "\"truncated\": true marks a result that had more (narrow the query, or use "
                                "COUNT(*) or LIMIT)."),
                "parameters": {"type": "object",
                               "properties": {"query": {"type": "string", "description": "The SQLite SELECT query."}},
                               "required": ["query"], "additionalProperties": False}}},
            {"type": "function", "function": {
                "name": "schema",
                "description": "Return the database's tables as CREATE TABLE statements, with comments on the columns.",
                "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}},
        ]

    def call_tool(self, item: dict[str, Any], name: str, arguments: dict[str, Any]) -> str:
        if name == "schema":
            return self.schema()
        if name == "sql":
            query = arguments.get("query")
            if not isinstance(query, str) or not query.strip():
                raise ToolError('the "query" argument must be a string holding one SELECT statement')
            return self.run_query(query)
        raise ToolError(f"there is no tool {name!r} (tools: schema, sql)")

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self._uri, uri=True)
        except sqlite3.Error as err:
            raise ToolError(f"cannot open the database: {err}") from None
        return conn

    def schema(self) -> str:
        """The CREATE TABLE statements (and views), in the order they were made."""
        if self._schema is None:
            conn = self._connect()
            try:
                rows = conn.execute("SELECT sql FROM sqlite_master WHERE type IN ('table', 'view') "
                                    "AND name NOT LIKE 'sqlite_%' AND sql IS NOT NULL ORDER BY rowid").fetchall()
            except sqlite3.Error as err:
                raise ToolError(f"cannot read the schema: {err}") from None
            finally:
                conn.close()
            self._schema = "\n\n".join(f"{sql};" for (sql,) in rows)
        return self._schema

    def run_query(self, query: str) -> str:
        """One read-only SELECT, as JSON; a ToolError with SQLite's message when it fails."""
        body = check_select(query)
        steps = 0

        def progress() -> int:
            nonlocal steps
            steps += _PROGRESS_EVERY
            return 1 if steps > STEP_LIMIT else 0

        conn = self._connect()
        try:
            conn.execute("PRAGMA query_only = ON")
            conn.set_authorizer(_authorize)
            conn.set_progress_handler(progress, _PROGRESS_EVERY)
            cursor = conn.execute(body)
            columns = [d[0] for d in cursor.description or ()]
            rows = cursor.fetchmany(self.row_limit + 1)
        except (ValueError, UnicodeError) as err:  # text SQLite cannot take (a lone surrogate, a NUL)
            raise ToolError(f"the query cannot be run: {err}") from None
        except (sqlite3.Error, sqlite3.Warning) as err:  # Python < 3.12 raises sqlite3.Warning for two statements
            if steps > STEP_LIMIT:
                raise ToolError("the query ran too long and was stopped; narrow it (a WHERE, a LIMIT) or avoid "
                                "joining large tables without a condition") from None
            message = str(err)
            if "not authorized" in message:
                message += " (only reading the tables is allowed)"
            raise ToolError(message) from None
        finally:
            conn.close()
        out: dict[str, Any] = {"columns": columns,
                               "rows": [[_json_value(v) for v in row] for row in rows[:self.row_limit]]}
        out["row_count"] = len(out["rows"])
        if len(rows) > self.row_limit:
            out["truncated"] = True
        return _dumps(out)

    def task_message(self, item: dict[str, Any]) -> str:
        return f"{item['question']}\nAnswer with the value only."

    def score(self, answer: str, item: dict[str, Any]) -> tuple[float, float, str]:
        return score_answer(answer, item["answers"])

    def describe_item(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"id": item["id"], "task_type": item.get("task_type", ""), "expected": item["answers"]}

    def reference_calls(self, item: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        return [("sql", {"query": item["sql"]})]
