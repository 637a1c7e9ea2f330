#!/usr/bin/env python
"""Our Standard against `transformers`' Llama on the same weights, and AnchorMass made from them:
prefill and decode time per length, decode against its physical floor (anchormass/bench/vs_transformers.py).

    python scripts/bench_hf.py ckpt=imports/smollm2/model.ckpt out=docs/results/smollm2/efficiency

Options (key=value): ckpt (a Standard checkpoint, required), lengths ([1K,2K,4K,8K]), repeats (2),
decode_tokens (16), threads (1: on a shared machine more threads stall at every op's barrier),
anchormass (the AnchorMass cell timed beside it: <share>/g<G>, default 2/g8: two of each layer's KV
groups global, by index: which groups does not change the time), out (outputs/bench/vs_transformers),
train_length (0: none; else also one training step on that many tokens: ours fp32, bf16 autocast,
compile=true adds torch.compile, against transformers; with it, the AnchorMass cell's two retrofit
steps too: end to end and layer-local attention transfer, docs/method.md §6 l), compare (true: the
prefill / decode comparison; false: the training step alone).
Writes <out>/bench_hf.md and bench_hf.json (after every length, so a stopped run keeps what it measured).
"""

from __future__ import annotations

import sys
from pathlib import Path

from anchormass.cli import exit_on_error, key_value_options
from anchormass.errors import ConfigError

DEFAULTS = {"ckpt": None, "lengths": "[1K,2K,4K,8K]", "repeats": 2, "decode_tokens": 16, "threads": 1,
            "anchormass": "2/g8", "out": "outputs/bench/vs_transformers", "train_length": 0, "compile": "false",
            "compare": "true"}


def parse(argv: list[str]) -> dict:
    opts = key_value_options(argv, DEFAULTS)
    if not opts["ckpt"]:
        raise ConfigError("ckpt=<a Standard checkpoint> is required (e.g. imports/smollm2/model.ckpt)")
    share, _, g = str(opts["anchormass"]).partition("/g")
    if not (share.isdigit() and g.isdigit()):
        raise ConfigError(f"anchormass={opts['anchormass']}: use <global KV groups per layer>/g<group size>, e.g. 2/g8")
    opts["anchormass"] = (int(share), int(g))
    for key in ("repeats", "decode_tokens", "threads", "train_length"):
        if not str(opts[key]).isdigit() or int(opts[key]) < (0 if key == "train_length" else 1):
            raise ConfigError(f"{key} must be a whole number (>= 1 except train_length), got {opts[key]!r}")
        opts[key] = int(opts[key])
    for key in ("compile", "compare"):
        if str(opts[key]).lower() not in ("true", "false"):
            raise ConfigError(f"{key} must be true or false, got {opts[key]!r}")
        opts[key] = str(opts[key]).lower() == "true"
    if not opts["compare"] and not opts["train_length"]:
        raise ConfigError("compare=false leaves nothing to measure: set train_length=<tokens>")
    return opts


@exit_on_error
def main(argv: list[str]) -> None:
    opts = parse(argv)
    from anchormass.bench.run import lengths

    opts["lengths"] = lengths("lengths", str(opts["lengths"]).strip("[]").split(","))
    import torch

    from anchormass.bench import vs_transformers
    from anchormass.eval.suites.kv_frontier.variants import Variant, build_variant, chosen_groups
    from anchormass.hf.export_llama import llama_from_ours
    from anchormass.training.checkpoint import load_model
    from anchormass.utils import atomic_write_json, atomic_write_text

    torch.set_num_threads(opts["threads"])
    path = Path(opts["ckpt"])
    if not path.is_file():
        raise ConfigError(f"ckpt={path}: no such checkpoint")
    standard, _ = load_model(path)
    if standard.cfg.arch != "standard":
        raise ConfigError(f"ckpt={path}: a Standard checkpoint is needed, got arch {standard.cfg.arch!r}")
    share, g = opts["anchormass"]
    if not 1 <= share <= standard.cfg.kv_heads:
        raise ConfigError(f"anchormass={share}/g{g}: the model has {standard.cfg.kv_heads} KV groups per layer")
    groups = chosen_groups(torch.zeros(standard.cfg.n_layers, standard.cfg.kv_heads), share, "index")
    anchormass = build_variant(standard, Variant(share, "index", g, True), groups)
    hf = llama_from_ours(standard, {"bos": 1, "eos": 2, "pad": 0, "unk": 0})  # ids: generation settings only
    out = Path(opts["out"])
    partial = {"rows": []}

    def keep(row):
        partial["rows"].append(row)
        atomic_write_json(out / "bench_hf.json", partial)
        pre, dec = row["prefill_s"], row["decode_ms_per_token"]
        print(f"{row['length']:>6,} tokens: prefill ours {pre['ours']['median_s']:.2f} s, transformers "
              f"{pre['transformers']['median_s']:.2f} s; decode ms/token ours {dec['ours']:.1f}, transformers "
              f"{dec['transformers']:.1f}, AnchorMass {dec['anchormass']:.1f}", flush=True)

    result = (vs_transformers.compare(standard, hf, anchormass, opts["lengths"], opts["repeats"],
                                      opts["decode_tokens"], on_length=keep) if opts["compare"] else {"rows": []})
    if opts["train_length"]:
        result["train"] = vs_transformers.train_steps(standard, hf, opts["train_length"], opts["repeats"],
                                                      compiled=opts["compile"], anchormass=anchormass.train())
    result["checkpoint"] = str(path)
    atomic_write_json(out / "bench_hf.json", result)
    text = vs_transformers.report(result)
    atomic_write_text(out / "bench_hf.md", text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
