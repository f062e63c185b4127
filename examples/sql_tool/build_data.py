"""Build the sql environment's bundled data: the ISO countries database and its question splits.

    python3 -m pip install pycountry          # only for this script; skillstate does not need it
    python3 examples/sql_tool/build_data.py   # writes skillstate/envs/data/countries/

Writes to skillstate/envs/data/countries/ (or --out DIR):
- countries.sqlite: real ISO data from pycountry (which packages Debian's
  iso-codes, LGPL-2.1): ISO 3166-1 countries, ISO 3166-2 subdivisions,
  ISO 4217 currencies and the ISO 639-1 languages (those with a two-letter
  code);
- train.jsonl, val.jsonl, test.jsonl (60/30/30 by default): questions of
  five task types (lookup, reverse_lookup, count, currency, aggregate), each
  split balanced over the types. Every item holds its reference query in
  `sql`; its answers[0] is what that query returns through
  SqlEnv.call_tool (the script checks this for every item).

The questions are drawn with a seeded random.Random in a fixed order, so
running the script again with the same pycountry version writes
byte-identical .jsonl files. Questions only name countries whose ISO short
name has no comma, parenthesis or apostrophe, and only currency names that
are unique, so that each has exactly one answer.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sqlite3
import tempfile
import unicodedata
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pycountry

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "skillstate" / "envs" / "data" / "countries"
TASK_TYPES = ("lookup", "reverse_lookup", "count", "currency", "aggregate")

SCHEMA = """\
CREATE TABLE countries (
    alpha_2 TEXT PRIMARY KEY,        -- ISO 3166-1 alpha-2 code, e.g. 'FR'
    alpha_3 TEXT NOT NULL UNIQUE,    -- ISO 3166-1 alpha-3 code, e.g. 'FRA'
    numeric TEXT NOT NULL UNIQUE,    -- ISO 3166-1 numeric code: three digits as text, e.g. '250'
    name TEXT NOT NULL,              -- ISO short name, e.g. 'France'
    official_name TEXT,              -- full official name, e.g. 'French Republic'; NULL when ISO gives none
    common_name TEXT                 -- a commonly used name where it differs from name, e.g. 'Vietnam'; else NULL
);
CREATE TABLE subdivisions (
    code TEXT PRIMARY KEY,           -- ISO 3166-2 code, e.g. 'FR-75C'
    country_alpha_2 TEXT NOT NULL REFERENCES countries (alpha_2),
    name TEXT NOT NULL,              -- e.g. 'Paris'
    type TEXT NOT NULL,              -- e.g. 'Province', 'State', 'Metropolitan department'
    parent_code TEXT                 -- code of the subdivision it lies in (e.g. 'FR-IDF'); NULL at the top level
);
CREATE INDEX subdivisions_country ON subdivisions (country_alpha_2);
CREATE TABLE currencies (
    alpha_3 TEXT PRIMARY KEY,        -- ISO 4217 alphabetic code, e.g. 'EUR'
    numeric TEXT NOT NULL,           -- ISO 4217 numeric code: three digits as text, e.g. '978'
    name TEXT NOT NULL               -- e.g. 'Euro'
);
CREATE TABLE languages (
    alpha_2 TEXT PRIMARY KEY,        -- ISO 639-1 code, e.g. 'fr'
    alpha_3 TEXT NOT NULL UNIQUE,    -- ISO 639-3 code, e.g. 'fra'
    name TEXT NOT NULL               -- English name, e.g. 'French'
);
"""


def build_database(path: Path) -> None:
    """Write the database to `path` (atomically: a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".sqlite.tmp")
    os.close(fd)
    try:
        conn = sqlite3.connect(tmp)
        conn.executescript(SCHEMA)
        conn.executemany("INSERT INTO countries VALUES (?, ?, ?, ?, ?, ?)", sorted(
            (c.alpha_2, c.alpha_3, c.numeric, c.name, getattr(c, "official_name", None),
             getattr(c, "common_name", None)) for c in pycountry.countries))
        conn.executemany("INSERT INTO subdivisions VALUES (?, ?, ?, ?, ?)", sorted(
            (s.code, s.country_code, s.name, s.type, s.parent_code) for s in pycountry.subdivisions))
        conn.executemany("INSERT INTO currencies VALUES (?, ?, ?)", sorted(
            (c.alpha_3, c.numeric, c.name) for c in pycountry.currencies))
        conn.executemany("INSERT INTO languages VALUES (?, ?, ?)", sorted(
            (lang.alpha_2, lang.alpha_3, lang.name) for lang in pycountry.languages if hasattr(lang, "alpha_2")))
        conn.commit()
        conn.execute("VACUUM")
        conn.close()
        os.chmod(tmp, 0o644)  # mkstemp makes it private
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def q(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def clean(name: str) -> bool:
    return not any(ch in name for ch in ",()'")


def country_alternatives(name: str, common: str | None) -> list[str]:
    return [name] + ([common] if common and common != name else [])


Candidate = dict[str, Any]  # question, answers, sql (answers[0] is checked against the query)


def candidates(db: sqlite3.Connection, seed: int) -> dict[str, list[list[Candidate]]]:
    """For each task type, its question forms, each a list of candidate items in a fixed order."""
    countries = db.execute("SELECT alpha_2, alpha_3, numeric, name, official_name, common_name FROM countries "
                           "ORDER BY alpha_2").fetchall()
    named = [c for c in countries if clean(c[3])]
    by_alpha2 = {c[0]: c for c in named}
    sub_counts = dict(db.execute("SELECT country_alpha_2, COUNT(*) FROM subdivisions GROUP BY country_alpha_2"))
    type_counts = db.execute("SELECT country_alpha_2, type, COUNT(*) FROM subdivisions "
                             "GROUP BY country_alpha_2, type ORDER BY country_alpha_2, type").fetchall()
    types_per_country = Counter(c for c, _, _ in type_counts)
    currencies = db.execute("SELECT alpha_3, numeric, name FROM currencies ORDER BY alpha_3").fetchall()
    name_uses = Counter(name for _, _, name in currencies)
    languages = db.execute("SELECT alpha_2, name FROM languages ORDER BY alpha_2").fetchall()

    lookup = [
        [{"question": f"What is the ISO 3166-1 alpha-3 code of {name}?", "answers": [a3],
          "sql": f"SELECT alpha_3 FROM countries WHERE name = {q(name)}"} for _, a3, _, name, _, _ in named],
        [{"question": f"What is the three-digit ISO 3166-1 numeric code of {name}?", "answers": [num],
          "sql": f"SELECT numeric FROM countries WHERE name = {q(name)}"} for _, _, num, name, _, _ in named],
        [{"question": f"What is the official name of {name} in ISO 3166-1?", "answers": [official],
          "sql": f"SELECT official_name FROM countries WHERE name = {q(name)}"}
         for _, _, _, name, official, _ in named if official and official != name],
    ]
    reverse = [
        [{"question": f"Which country has the ISO 3166-1 alpha-2 code '{a2}'?",
          "answers": country_alternatives(name, common),
          "sql": f"SELECT name FROM countries WHERE alpha_2 = {q(a2)}"} for a2, _, _, name, _, common in named],
        [{"question": f"Which country has the ISO 3166-1 alpha-3 code '{a3}'?",
          "answers": country_alternatives(name, common),
          "sql": f"SELECT name FROM countries WHERE alpha_3 = {q(a3)}"} for _, a3, _, name, _, common in named],
        [{"question": f"Which country has the ISO 3166-1 numeric code '{num}'?",
          "answers": country_alternatives(name, common),
          "sql": f"SELECT name FROM countries WHERE numeric = {q(num)}"} for _, _, num, name, _, common in named],
        [{"question": f"Which language has the ISO 639-1 code '{a2}'?", "answers": [name],
          "sql": f"SELECT name FROM languages WHERE alpha_2 = {q(a2)}"} for a2, name in languages if clean(name)],
    ]
    count = [
        [{"question": f"How many subdivisions of type '{typ}' does {by_alpha2[c][3]} have in ISO 3166-2?",
          "answers": [str(n)],
          "sql": ("SELECT COUNT(*) FROM subdivisions s JOIN countries c ON c.alpha_2 = s.country_alpha_2 "
                  f"WHERE c.name = {q(by_alpha2[c][3])} AND s.type = {q(typ)}")}
         for c, typ, n in type_counts if c in by_alpha2 and types_per_country[c] >= 2 and 2 <= n <= 80],
        [{"question": f"How many subdivisions does {by_alpha2[c][3]} have in ISO 3166-2 in total?",
          "answers": [str(n)],
          "sql": ("SELECT COUNT(*) FROM subdivisions s JOIN countries c ON c.alpha_2 = s.country_alpha_2 "
                  f"WHERE c.name = {q(by_alpha2[c][3])}")}
         for c, n in sorted(sub_counts.items()) if c in by_alpha2 and 3 <= n <= 150],
        [{"question": f"How many ISO 3166-2 subdivisions have the parent code '{parent}'?", "answers": [str(n)],
          "sql": f"SELECT COUNT(*) FROM subdivisions WHERE parent_code = {q(parent)}"}
         for parent, n in db.execute("SELECT parent_code, COUNT(*) FROM subdivisions WHERE parent_code IS NOT NULL "
                                     "GROUP BY parent_code ORDER BY parent_code") if n >= 2],
    ]
    currency = [
        [{"question": f"What is the name of the currency with ISO 4217 code '{code}'?", "answers": [name],
          "sql": f"SELECT name FROM currencies WHERE alpha_3 = {q(code)}"}
         for code, _, name in currencies if clean(name)],
        [{"question": f"What is the ISO 4217 alphabetic code of the currency named '{name}'?", "answers": [code],
          "sql": f"SELECT alpha_3 FROM currencies WHERE name = {q(name)}"}
         for code, _, name in currencies if clean(name) and name_uses[name] == 1],
        [{"question": f"What is the three-digit ISO 4217 numeric code of the currency '{code}'?", "answers": [num],
          "sql": f"SELECT numeric FROM currencies WHERE alpha_3 = {q(code)}"} for code, num, _ in currencies],
    ]
    letters = Counter(c[3][0] for c in countries)
    accented = {unicodedata.normalize("NFD", x)[0] for x in letters if not x.isascii()}
    words = ("Dollar", "Franc", "Peso", "Pound", "Dinar", "Rupee", "Rial", "Krona", "Krone", "Shilling", "Dirham",
             "Real", "Won")
    aggregate = [
        most_subdivisions(named, sub_counts, random.Random(seed + 1)),
        [{"question": f"How many countries in ISO 3166-1 have a short name starting with the letter '{letter}'?",
          "answers": [str(n)], "sql": f"SELECT COUNT(*) FROM countries WHERE name LIKE {q(letter + '%')}"}
         for letter, n in sorted(letters.items())
         # a name starting with an accented letter (Åland) would make its base letter ambiguous
         if letter.isascii() and n >= 2 and letter not in accented],
        [{"question": f"How many different subdivision types does {by_alpha2[c][3]} have in ISO 3166-2?",
          "answers": [str(n)],
          "sql": ("SELECT COUNT(DISTINCT s.type) FROM subdivisions s JOIN countries c "
                  f"ON c.alpha_2 = s.country_alpha_2 WHERE c.name = {q(by_alpha2[c][3])}")}
         for c, n in sorted(types_per_country.items()) if c in by_alpha2 and n >= 2],
        [{"question": f"How many ISO 4217 currencies have the word '{w}' in their name?", "answers": [str(n)],
          "sql": f"SELECT COUNT(*) FROM currencies WHERE name LIKE {q('%' + w + '%')}"}
         for w in words
         # only words the LIKE count gets exactly right: whole words, in this case
         if (n := sum(1 for _, _, name in currencies if re.search(rf"\b{w}\b", name))) >= 2
         and n == sum(1 for _, _, name in currencies if w.lower() in name.lower())],
    ]
    return {"lookup": lookup, "reverse_lookup": reverse, "count": count, "currency": currency,
            "aggregate": aggregate}


def most_subdivisions(named: list[tuple[Any, ...]], sub_counts: dict[str, int],
                      rng: random.Random) -> list[Candidate]:
    """'Which of these four countries has the most subdivisions', for sets with a clear winner."""
    pool = [c for c in named if sub_counts.get(c[0], 0) >= 2]
    out, seen = [], set()
    for _ in range(2000):
        picks = rng.sample(pool, 4)
        counts = sorted((sub_counts[c[0]] for c in picks), reverse=True)
        key = frozenset(c[0] for c in picks)
        if counts[0] <= counts[1] or key in seen:
            continue
        seen.add(key)
        names = [c[3] for c in picks]
        winner = max(picks, key=lambda c: sub_counts[c[0]])[3]
        listed = ", ".join(names[:-1]) + f" or {names[-1]}"
        out.append({"question": f"Which of these countries has the most ISO 3166-2 subdivisions: {listed}?",
                    "answers": [winner],
                    "sql": ("SELECT c.name FROM countries c JOIN subdivisions s ON s.country_alpha_2 = c.alpha_2 "
                            f"WHERE c.name IN ({', '.join(q(n) for n in names)}) "
                            "GROUP BY c.alpha_2 ORDER BY COUNT(*) DESC LIMIT 1")})
        if len(out) >= 200:
            break
    return out


def split_sizes(sizes: list[int]) -> list[list[int]]:
    """Per split, the number of items of each task type (balanced; the remainder to the first types)."""
    k = len(TASK_TYPES)
    return [[n // k + (1 if i < n % k else 0) for i in range(k)] for n in sizes]


def draw(forms: list[list[Candidate]], n: int, rng: random.Random) -> list[Candidate]:
    """n distinct candidates, taking the forms in turn."""
    pools = [rng.sample(form, len(form)) for form in forms]
    out: list[Candidate] = []
    i = 0
    while len(out) < n:
        if not any(pools):
            raise SystemExit(f"not enough candidates: wanted {n}, have {len(out)}")
        pool = pools[i % len(pools)]
        if pool:
            out.append(pool.pop())
        i += 1
    rng.shuffle(out)
    return out


def make_splits(db: sqlite3.Connection, sizes: list[int], seed: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    forms = candidates(db, seed)
    per_split = split_sizes(sizes)
    splits: list[list[dict[str, Any]]] = [[] for _ in sizes]
    for t, task_type in enumerate(TASK_TYPES):
        drawn = draw(forms[task_type], sum(counts[t] for counts in per_split), rng)
        for s, counts in enumerate(per_split):
            splits[s].extend({"task_type": task_type, **c} for c in drawn[:counts[t]])
            drawn = drawn[counts[t]:]
    numbers: defaultdict[str, int] = defaultdict(int)
    out = []
    for items in splits:
        rng.shuffle(items)
        shaped = []
        for item in items:
            numbers[item["task_type"]] += 1
            shaped.append({"id": f"{item['task_type']}-{numbers[item['task_type']]:03d}", "question": item["question"],
                           "answers": item["answers"], "task_type": item["task_type"], "sql": item["sql"]})
        out.append(shaped)
    return out


def check(database: Path, splits: list[list[dict[str, Any]]]) -> None:
    """Every item's reference query, run through SqlEnv.call_tool, gives one row of one column: answers[0]."""
    from skillstate.envs.sql import SqlConfig, SqlEnv

    env = SqlEnv({}, SqlConfig(database=str(database)))
    questions: set[str] = set()
    for items in splits:
        for item in items:
            result = json.loads(env.call_tool(item, "sql", {"query": item["sql"]}))
            assert len(result["columns"]) == 1 and result["row_count"] == 1, (item["id"], result)
            assert str(result["rows"][0][0]) == item["answers"][0], (item["id"], result, item["answers"])
            assert item["question"] not in questions, f"duplicate question: {item['question']}"
            questions.add(item["question"])


def write_jsonl(path: Path, items: list[dict[str, Any]]) -> None:
    text = "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in items)
    path.write_bytes(text.encode("utf-8"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--sizes", type=int, nargs=3, default=[60, 30, 30], metavar=("TRAIN", "VAL", "TEST"))
    args = parser.parse_args(argv)
    database = args.out / "countries.sqlite"
    build_database(database)
    db = sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro", uri=True)
    try:
        splits = make_splits(db, args.sizes, args.seed)
        tables = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]  # fixed table names
                  for t in ("countries", "subdivisions", "currencies", "languages")}
    finally:
        db.close()
    check(database, splits)
    for name, items in zip(("train", "val", "test"), splits, strict=True):
        write_jsonl(args.out / f"{name}.jsonl", items)
    print(f"pycountry {getattr(pycountry, '__version__', '?')}: {database} ({database.stat().st_size:,} bytes), "
          + ", ".join(f"{t} {n}" for t, n in tables.items()))
    for name, items in zip(("train", "val", "test"), splits, strict=True):
        print(f"{name}: {len(items)} items, " + ", ".join(f"{t} {n}" for t, n in
                                                          Counter(i["task_type"] for i in items).items()))


if __name__ == "__main__":
    main()
