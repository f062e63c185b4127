"""The bundled workspace tasks: changes to `tally`, a small Python ledger library, each checked by pytest.

Four kinds of task, eight of each, where knowing the project's ways decides the outcome:
- `bugfix`: a bug a user reports; the check runs the project's own tests (restored first, so an agent
  that edits a test to pass it fails; a `conftest.py` or a config file it adds is not read);
- `money`: a new function of `tally/money.py`; the project keeps amounts as an int number of cents,
  and the check tests exact integer results;
- `command`: a new command of the `tally` command line; commands are registered with
  `@command("name")` in `tally/commands.py`, which is where the check looks them up;
- `export`: a new public helper; public names are exported from `tally/__init__.py` and listed in
  `__all__`, which the check imports.

Every item holds its starting files, the instruction, the check (a command, the test files written
into the workspace just before it runs, and its JUnit report), and a reference `solution` (the files it
changes), which
the tests check passes, and which the sim's coding agent writes when the skill tells it the way.
"""

from __future__ import annotations

from typing import Any

INIT = '''"""tally: a small ledger library."""

from tally.ledger import Ledger
from tally.money import format_cents, parse_amount

__all__ = ["Ledger", "format_cents", "parse_amount"]
'''

MONEY = '''"""Amounts of money."""


def format_cents(cents: int) -> str:
    """12345 -> '123.45'; a negative amount keeps its sign."""
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}{cents // 100}.{cents % 100:02d}"


def parse_amount(text: str) -> int:
    """'123.45' -> 12345, '-0.5' -> -50."""
    text = text.strip()
    sign = -1 if text.startswith("-") else 1
    whole, _, frac = text.lstrip("+-").partition(".")
    return sign * (int(whole or "0") * 100 + int((frac + "00")[:2]))
'''

LEDGER = '''"""A ledger: labelled entries, in cents."""

from dataclasses import dataclass, field


@dataclass
class Entry:
    label: str
    cents: int


@dataclass
class Ledger:
    entries: list[Entry] = field(default_factory=list)

    def add(self, label: str, cents: int) -> None:
        self.entries.append(Entry(label, cents))

    def balance(self) -> int:
        return sum(e.cents for e in self.entries)

    def labels(self) -> list[str]:
        return sorted({e.label for e in self.entries})
'''

COMMANDS = '''"""The tally command line: every command is a function of a Ledger, registered by name."""

from tally.money import format_cents

COMMANDS = {}


def command(name):
    def register(fn):
        COMMANDS[name] = fn
        return fn
    return register


@command("balance")
def balance(ledger):
    return format_cents(ledger.balance())
'''

TEST_MONEY = '''from tally.money import format_cents, parse_amount


def test_format_cents():
    assert format_cents(12345) == "123.45"
    assert format_cents(5) == "0.05"
    assert format_cents(-250) == "-2.50"


def test_parse_amount():
    assert parse_amount("123.45") == 12345
    assert parse_amount("7") == 700
    assert parse_amount("-0.5") == -50
    assert parse_amount(" 3.1 ") == 310
'''

TEST_LEDGER = '''from tally.ledger import Ledger


def test_balance_and_labels():
    book = Ledger()
    book.add("rent", -50000)
    book.add("pay", 120000)
    book.add("rent", -1000)
    assert book.balance() == 69000
    assert book.labels() == ["pay", "rent"]


def test_empty():
    assert Ledger().balance() == 0 and Ledger().labels() == []
'''

README = '''# tally

A small ledger library. Run the tests with `python -m pytest -q`.
'''

BASE = {"tally/__init__.py": INIT, "tally/money.py": MONEY, "tally/ledger.py": LEDGER,
        "tally/commands.py": COMMANDS, "tests/test_money.py": TEST_MONEY, "tests/test_ledger.py": TEST_LEDGER,
        "README.md": README}
PROJECT_TESTS = {"tests/test_money.py": TEST_MONEY, "tests/test_ledger.py": TEST_LEDGER}
# pytest isolated from what the agent may have added: no conftest.py, no config file, no module of the
# workspace imported before the tests (a pytest.py there would stand in for pytest); `tally` is found through
# the pythonpath option. It proves it ran: its JUnit report, written where the agent cannot write, must list
# every test of the check's files as passed (`check_report: junit`), so code that ends pytest early with exit
# code 0 (`os._exit(0)` on import) fails.
PYTEST = ("{python} -I -m pytest -q -p no:cacheprovider --noconftest -c /dev/null --rootdir . "
          "-o pythonpath=\"$PWD\" --junitxml={report}")

# bugfix: (file, the correct line, the buggy line, what the user reports)
BUGS = [
    ("tally/money.py", 'return f"{sign}{cents // 100}.{cents % 100:02d}"',
     'return f"{sign}{cents // 100}.{cents % 100}"', "format_cents(5) gives '0.5' instead of '0.05'."),
    ("tally/money.py", 'sign = "-" if cents < 0 else ""', 'sign = ""',
     "format_cents(-250) gives '2.50': the minus sign is lost."),
    ("tally/money.py", 'return sign * (int(whole or "0") * 100 + int((frac + "00")[:2]))',
     'return sign * int(whole or "0") * 100 + int((frac + "00")[:2])',
     "parse_amount('-0.5') gives 50 instead of -50."),
    ("tally/money.py", 'whole, _, frac = text.lstrip("+-").partition(".")',
     'whole, _, frac = text.lstrip("+-").partition(",")', "parse_amount('123.45') fails with a ValueError."),
    ("tally/money.py", '    text = text.strip()\n', '', "parse_amount(' 3.1 ') fails: surrounding spaces break it."),
    ("tally/ledger.py", "return sum(e.cents for e in self.entries)", "return sum(abs(e.cents) for e in self.entries)",
     "Ledger.balance() counts expenses as income: the balance is too high."),
    ("tally/ledger.py", "return sorted({e.label for e in self.entries})", "return [e.label for e in self.entries]",
     "Ledger.labels() repeats labels and does not sort them."),
    ("tally/ledger.py", "self.entries.append(Entry(label, cents))", "self.entries.append(Entry(label, abs(cents)))",
     "Ledger.add() turns a negative amount positive."),
]

# money: (name, signature, what it returns, the body, a float body as an agent that ignores the convention
# writes it, the checks)
MONEY_FUNCS = [
    ("percent_of", "percent_of(cents: int, percent: int) -> int",
     "the given percent of an amount, rounded half up to the cent",
     "    return (cents * percent * 2 + 100) // 200\n", "    return round(cents * percent / 100, 2)\n",
     ["percent_of(1000, 15) == 150", "percent_of(333, 50) == 167", "percent_of(5, 10) == 1"]),
    ("split_evenly", "split_evenly(cents: int, parts: int) -> list[int]",
     "an amount split into `parts` shares that differ by at most a cent and add up to it, larger shares first",
     "    base, extra = divmod(cents, parts)\n    return [base + 1] * extra + [base] * (parts - extra)\n",
     "    return [round(cents / parts, 2)] * parts\n",
     ["split_evenly(1000, 3) == [334, 333, 333]", "split_evenly(5, 2) == [3, 2]", "sum(split_evenly(101, 4)) == 101"]),
    ("add_tax", "add_tax(cents: int, basis_points: int) -> int",
     "the amount with a tax of `basis_points` hundredths of a percent added, rounded half up",
     "    return cents + (cents * basis_points * 2 + 10000) // 20000\n",
     "    return round(cents * (1 + basis_points / 10000), 2)\n",
     ["add_tax(10000, 2000) == 12000", "add_tax(999, 825) == 1081", "add_tax(1, 5000) == 2"]),
    ("round_to_dollar", "round_to_dollar(cents: int) -> int",
     "the amount rounded half up to a whole dollar (a multiple of 100 cents)",
     "    return (cents + 50) // 100 * 100\n", "    return round(cents / 100) * 100.0\n",
     ["round_to_dollar(1249) == 1200", "round_to_dollar(1250) == 1300", "round_to_dollar(49) == 0"]),
    ("average", "average(amounts: list[int]) -> int",
     "the mean of amounts, rounded half up to the cent (0 for none)",
     "    if not amounts:\n        return 0\n    return (sum(amounts) * 2 + len(amounts)) // (2 * len(amounts))\n",
     "    return sum(amounts) / len(amounts) if amounts else 0.0\n",
     ["average([100, 200]) == 150", "average([1, 2]) == 2", "average([]) == 0"]),
    ("discount", "discount(cents: int, percent: int) -> int",
     "the amount less `percent` percent, the discount rounded half up",
     "    return cents - (cents * percent * 2 + 100) // 200\n", "    return cents * (1 - percent / 100)\n",
     ["discount(1000, 15) == 850", "discount(333, 50) == 166", "discount(999, 0) == 999"]),
    ("convert", "convert(cents: int, rate_millis: int) -> int",
     "the amount in another currency at `rate_millis` thousandths per unit, rounded half up",
     "    return (cents * rate_millis * 2 + 1000) // 2000\n", "    return cents * rate_millis / 1000\n",
     ["convert(1000, 1085) == 1085", "convert(333, 1500) == 500", "convert(1, 499) == 0"]),
    ("tip", "tip(cents: int) -> int", "an 18 percent tip on an amount, rounded half up to the cent",
     "    return (cents * 18 * 2 + 100) // 200\n", "    return round(cents * 0.18, 2)\n",
     ["tip(1000) == 180", "tip(2550) == 459", "tip(3) == 1"]),
]

# command: (name, what it prints, body, check on a sample ledger)
SAMPLE = 'book = Ledger()\n    book.add("rent", -50000)\n    book.add("pay", 120000)\n    book.add("food", -2550)\n'
CMDS = [
    ("count", "the number of entries", "    return str(len(ledger.entries))\n", '"3"'),
    ("income", "the total of positive entries, formatted like balance",
     "    return format_cents(sum(e.cents for e in ledger.entries if e.cents > 0))\n", '"1200.00"'),
    ("spent", "the total of negative entries as a positive amount, formatted like balance",
     "    return format_cents(-sum(e.cents for e in ledger.entries if e.cents < 0))\n", '"525.50"'),
    ("labels", "the labels, sorted, comma-separated", '    return ",".join(ledger.labels())\n', '"food,pay,rent"'),
    ("largest", "the label of the largest entry", "    return max(ledger.entries, key=lambda e: e.cents).label\n",
     '"pay"'),
    ("smallest", "the label of the smallest entry", "    return min(ledger.entries, key=lambda e: e.cents).label\n",
     '"rent"'),
    ("first", "the label of the first entry added", "    return ledger.entries[0].label\n", '"rent"'),
    ("last", "the label of the last entry added", "    return ledger.entries[-1].label\n", '"food"'),
]

# export: (name, module, what it does, body, check)
EXPORTS = [
    ("is_debit", "tally/ledger.py", "whether an entry is money going out (a negative amount)",
     "def is_debit(entry) -> bool:\n    return entry.cents < 0\n",
     "is_debit(Entry('x', -1)) and not is_debit(Entry('x', 5))"),
    ("is_credit", "tally/ledger.py", "whether an entry is money coming in (a positive amount)",
     "def is_credit(entry) -> bool:\n    return entry.cents > 0\n",
     "is_credit(Entry('x', 5)) and not is_credit(Entry('x', -1))"),
    ("total_of", "tally/ledger.py", "the total of a ledger's entries with one label",
     "def total_of(ledger, label: str) -> int:\n    return sum(e.cents for e in ledger.entries if e.label == label)\n",
     "total_of(_book(), 'rent') == -50000"),
    ("entries_for", "tally/ledger.py", "the entries of a ledger with one label, in order",
     "def entries_for(ledger, label: str) -> list:\n    return [e for e in ledger.entries if e.label == label]\n",
     "[e.cents for e in entries_for(_book(), 'pay')] == [120000]"),
    ("format_signed", "tally/money.py", "an amount formatted like format_cents, with a '+' before a positive one",
     "def format_signed(cents: int) -> str:\n    text = format_cents(cents)\n"
     "    return '+' + text if cents > 0 else text\n",
     "format_signed(150) == '+1.50' and format_signed(-5) == '-0.05'"),
    ("is_round", "tally/money.py", "whether an amount is a whole number of dollars",
     "def is_round(cents: int) -> bool:\n    return cents % 100 == 0\n", "is_round(300) and not is_round(301)"),
    ("cents_of", "tally/money.py", "the cents part of an amount (0 to 99, of its absolute value)",
     "def cents_of(cents: int) -> int:\n    return abs(cents) % 100\n", "cents_of(-1234) == 34 and cents_of(500) == 0"),
    ("dollars_of", "tally/money.py", "the whole dollars of an amount (of its absolute value)",
     "def dollars_of(cents: int) -> int:\n    return abs(cents) // 100\n",
     "dollars_of(-1234) == 12 and dollars_of(99) == 0"),
]


def _bugfix(n: int) -> dict[str, Any]:
    path, good, bad, report = BUGS[n]
    assert good in BASE[path], good
    broken = BASE[path].replace(good, bad, 1) if bad else BASE[path].replace(good, "", 1)
    return {"id": f"bugfix-{n + 1:02d}", "task_type": "bugfix",
            "instruction": f"A user reports a bug: {report} Find the cause and fix it.",
            "files": {**BASE, path: broken}, "solution": {path: BASE[path]},
            "check": PYTEST + " " + " ".join(sorted(PROJECT_TESTS)), "check_files": PROJECT_TESTS,
            "check_report": "junit"}


def _money(n: int) -> dict[str, Any]:
    name, signature, doc, body, float_body, checks = MONEY_FUNCS[n]
    code = f'\n\ndef {signature}:\n    """{doc[0].upper()}{doc[1:]}."""\n'
    first = checks[0].split(" == ")[0]
    test = (f"from tally.money import {name}\n\n\ndef test_{name}():\n" + "".join(f"    assert {c}\n" for c in checks)
            + f"    value = {first}\n"
            + "    assert all(type(x) is int for x in (value if isinstance(value, list) else [value]))\n")
    return {"id": f"money-{n + 1:02d}", "task_type": "money",
            "instruction": f"Add a function `{signature}` to tally/money.py: {doc}.",
            "files": dict(BASE), "solution": {"tally/money.py": MONEY + code + body},
            "wrong": {"tally/money.py": MONEY + code + float_body},
            "check": PYTEST + f" tests/test_{name}.py", "check_files": {f"tests/test_{name}.py": test},
            "check_report": "junit"}


def _command(n: int) -> dict[str, Any]:
    name, what, body, expected = CMDS[n]
    solution = COMMANDS + f'\n\n@command("{name}")\ndef {name}(ledger):\n{body}'
    test = (f"from tally.commands import COMMANDS\nfrom tally.ledger import Ledger\n\n\ndef test_{name}():\n"
            f"    {SAMPLE}    assert COMMANDS[{name!r}](book) == {expected}\n")
    wrong = f"from tally.money import format_cents\n\n\ndef {name}(ledger):\n{body}"
    return {"id": f"command-{n + 1:02d}", "task_type": "command",
            "instruction": f"Add a `{name}` command to the tally command line that returns {what}.",
            "files": dict(BASE), "solution": {"tally/commands.py": solution},
            "wrong": {f"tally/cli_{name}.py": wrong},
            "check": PYTEST + f" tests/test_cmd_{name}.py", "check_files": {f"tests/test_cmd_{name}.py": test},
            "check_report": "junit"}


def _export(n: int) -> dict[str, Any]:
    name, module, what, code, check = EXPORTS[n]
    changed = BASE[module] + "\n\n" + code
    mod = module.removesuffix(".py").replace("/", ".")
    init = BASE["tally/__init__.py"].replace('__all__ = ["Ledger", "format_cents", "parse_amount"]',
                                             f'from {mod} import {name}\n\n'
                                             f'__all__ = ["Ledger", "format_cents", "parse_amount", "{name}"]')
    test = (f"import tally\nfrom tally import {name}\nfrom tally.ledger import Entry, Ledger\n\n\n"
            f"def _book():\n    {SAMPLE}    return book\n\n\ndef test_{name}():\n    assert {check}\n"
            f"    assert {name!r} in tally.__all__\n")
    return {"id": f"export-{n + 1:02d}", "task_type": "export",
            "instruction": f"Add a public helper `{name}` to {module}: {what}. Users import it from the package.",
            "files": dict(BASE), "solution": {module: changed, "tally/__init__.py": init},
            "wrong": {module: changed},
            "check": PYTEST + f" tests/test_api_{name}.py", "check_files": {f"tests/test_api_{name}.py": test},
            "check_report": "junit"}


def bundled_tasks() -> list[dict[str, Any]]:
    """Every bundled task, the kinds interleaved."""
    makers = (_bugfix, _money, _command, _export)
    return [make(n) for n in range(8) for make in makers]


def bundled_splits(names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The bundled tasks split 12/10/10 (each split with every kind) under the first three split names."""
    tasks = bundled_tasks()
    cuts = {"train": tasks[:12], "val": tasks[12:22], "test": tasks[22:]}
    return {name: items for name, items in zip(names, cuts.values(), strict=False)}
