"""Data preparation throughput: tokens/s with 1 and with N worker processes, side by side in one run,
on the real Aozora + JSQuAD text (../shared/data, outside the checkout) repeated to >= `min_mb` MB.

The corpus is written to a scratch folder as two JSON-lines files of *raw* text (the Aozora novel
with its markup, the JSQuAD contexts), read by the `ja_real` recipe's cleaners, so the workers do
the real work: Aozora markup stripping, NFKC, chunking, SentencePiece. The tokenizer is trained once
on the unrepeated text (vocab 8,000 as in ja_real) and reused, so each run times reading + cleaning
+ encoding + writing. Each run is a fresh process (its peak RSS is its own); the runs' files must
be byte-identical, and are checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from anchormass.errors import DataError
from anchormass.utils import CHECKOUT, atomic_write_json, atomic_write_text

# a benchmark of the checkout (scripts/bench_data.py): its corpora lie beside it
SOURCE_ROOT = CHECKOUT or Path.cwd()
SHARED = SOURCE_ROOT.parent / "shared" / "data"
AOZORA = SHARED / "aozora" / "wagahai_wa_neko_de_aru.txt"
JSQUAD = SHARED / "jglue" / "jsquad-v1.3" / "valid-v1.3.json"


def _sources(folder: Path) -> list[dict]:
    return [{"kind": "files", "paths": [str(folder / "aozora.jsonl")], "streaming": True, "chunk_chars": 4000,
             "cleaners": ["aozora", "nfkc"]},
            {"kind": "files", "paths": [str(folder / "jsquad.jsonl")], "streaming": True,
             "cleaners": ["nfkc", "whitespace"]}]


def build_corpus(folder: Path, min_mb: float) -> dict:
    """aozora.jsonl / jsquad.jsonl in `folder`: the raw texts repeated until both hold >= min_mb MB."""
    for path in (AOZORA, JSQUAD):
        if not path.is_file():
            raise DataError(f"the data benchmark needs the real text at {path} (../shared/data beside the "
                            f"checkout; see its README); it is missing")
    novel = AOZORA.read_text(encoding="utf-8")
    squad = json.loads(JSQUAD.read_text(encoding="utf-8"))["data"]
    contexts = [p["context"] for article in squad for p in article["paragraphs"]]
    lines = {"aozora.jsonl": [json.dumps({"text": novel}, ensure_ascii=False) + "\n"],
             "jsquad.jsonl": [json.dumps({"text": c}, ensure_ascii=False) + "\n" for c in contexts]}
    once = sum(len(line.encode()) for group in lines.values() for line in group)
    repeats = max(1, -(-int(min_mb * 1e6) // once))
    folder.mkdir(parents=True, exist_ok=True)
    for name, group in lines.items():
        with open(folder / name, "w", encoding="utf-8") as fh:
            for _ in range(repeats):
                fh.writelines(group)
    size = sum((folder / n).stat().st_size for n in lines)
    return {"repeats": repeats, "bytes": size, "characters": repeats * (len(novel) + sum(map(len, contexts)))}


def train_tokenizer_once(folder: Path) -> Path:
    """The ja_real tokenizer (vocab 8,000) trained on one copy of the text; returns its path."""
    from anchormass.data.prepare import prepare

    once = folder / "once"
    once.mkdir(exist_ok=True)
    (once / "aozora.jsonl").write_text(json.dumps({"text": AOZORA.read_text(encoding="utf-8")}, ensure_ascii=False))
    squad = json.loads(JSQUAD.read_text(encoding="utf-8"))["data"]
    (once / "jsquad.jsonl").write_text("".join(json.dumps({"text": p["context"]}, ensure_ascii=False) + "\n"
                                               for a in squad for p in a["paragraphs"]))
    out, _ = prepare({"name": "tok", "out_dir": str(folder / "tok"), "source": _sources(once),
                      "tokenizer": {"vocab_size": 8000, "hard_vocab_limit": False}})
    return out / "tokenizer.model"


def one_run(folder: Path, tokenizer: Path, workers: int) -> dict:
    """Prepare the corpus with `workers` processes (call in a fresh process); time, tokens, peak RSS."""
    import datasets

    from anchormass.bench.peak_rss import PeakRSS
    from anchormass.data.prepare import prepare

    # The timer starts after library start-up: `load_dataset` imports torch, scipy, ... on first use
    # (~2 CPU s here), a fixed cost that says nothing about throughput.
    warm = folder / "warmup.jsonl"
    warm.write_text('{"text": "x"}\n')
    list(datasets.load_dataset("json", data_files=[str(warm)], split="train", streaming=True))

    cfg = {"name": f"bench_w{workers}", "out_dir": str(folder / f"out_w{workers}"), "source": _sources(folder),
           "val_fraction": 0.05, "tokenizer": {"path": str(tokenizer)}, "num_workers": workers}
    cpu0 = os.times()
    with PeakRSS() as peak:
        t0 = time.perf_counter()
        out, meta = prepare(cfg)
        seconds = time.perf_counter() - t0
    cpu1 = os.times()
    tokens = sum(s["tokens"] for s in meta["splits"].values())
    digest = hashlib.sha256(b"".join(hashlib.sha256((out / f"{s}.bin").read_bytes()).digest()
                                     for s in ("train", "val"))).hexdigest()
    main_cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    workers_cpu = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
    # On a loaded machine wall time says little; CPU seconds say what the work costs. With W workers
    # on >= W + 1 idle cores the wall time is about max(main, workers / W) CPU seconds.
    return {"workers": workers, "seconds": round(seconds, 2), "tokens": tokens,
            "tokens_per_s": round(tokens / seconds), "cpu_main_s": round(main_cpu, 2),
            "cpu_workers_s": round(workers_cpu, 2), "files_sha256": digest, "peak_rss": peak.as_dict()}


def run_all(folder: Path, min_mb: float = 100.0, workers: tuple[int, ...] = (1, 2)) -> dict:
    corpus = build_corpus(folder, min_mb)
    tokenizer = train_tokenizer_once(folder)
    runs = []
    for n in workers:
        cmd = [sys.executable, "-m", "anchormass.bench.data_prep", str(folder), str(tokenizer), str(n)]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=SOURCE_ROOT,
                             env={**os.environ, "PYTHONPATH": str(SOURCE_ROOT)})
        if res.returncode != 0:
            raise DataError(f"the {n}-worker run failed: {res.stderr.strip().splitlines()[-1:]}")
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    base = runs[0]["tokens_per_s"]
    for run in runs:
        run["speedup"] = round(run["tokens_per_s"] / base, 3)
    identical = len({r["files_sha256"] for r in runs}) == 1
    return {"corpus": {**corpus, "folder": str(folder), "source": f"{AOZORA.name} + {JSQUAD.name}, raw, repeated"},
            "cpu_count": os.cpu_count(), "load_average_before": os.getloadavg(), "runs": runs,
            "files_identical": identical}


def render(result: dict) -> str:
    c = result["corpus"]
    lines = [f"data preparation: {c['bytes'] / 1e6:.1f} MB ({c['characters']:,} characters, the real text x "
             f"{c['repeats']}), {result['cpu_count']} CPUs, load average before {result['load_average_before'][0]:.2f}",
             "| workers | seconds | tokens | tokens/s | speedup | CPU s main / workers | "
             "peak RSS main / largest worker / total (MiB) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["runs"]:
        p = r["peak_rss"]
        lines.append(f"| {r['workers']} | {r['seconds']} | {r['tokens']:,} | {r['tokens_per_s']:,} | {r['speedup']}x | "
                     f"{r['cpu_main_s']} / {r['cpu_workers_s']} | "
                     f"{p['main_mib']} / {p['largest_worker_mib']} / {p['total_mib']} |")
    lines.append(f"files byte-identical across runs: {result['files_identical']}")
    return "\n".join(lines)


def bench_data_prep(out: Path, min_mb: float, workers: tuple[int, ...]) -> str:
    """scripts/bench_data.py: the runs over a scratch corpus in out/scratch, their table written to
    out/bench_data.md and the numbers to out/bench_data.json; returns the table."""
    result = run_all(out / "scratch", min_mb, workers)
    text = render(result)
    atomic_write_json(out / "bench_data.json", result, indent=2)
    atomic_write_text(out / "bench_data.md", text + "\n")
    return text


if __name__ == "__main__":  # one run, in its own process: python -m anchormass.bench.data_prep <folder> <tok> <n>
    print(json.dumps(one_run(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))))
