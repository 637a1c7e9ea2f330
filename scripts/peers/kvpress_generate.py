"""Greedy answers under kvpress's presses, for per-item comparison with our own KV policies.

Runs in kvpress's own environment (`make kvpress-env`: kvpress pins an older `transformers` than
the project), so it imports neither `anchormass` nor anything that environment lacks. The project
writes the prompts as token ids (`items.json`), this script answers them, and the project scores
the answers with its own scorer; nothing is tokenised or scored here.

Protocol (the same as our Standard cache under a KV policy, docs/method.md §3): the whole prompt is
prefilled in one forward with the press active, so each layer's cache is compressed once, after
its full-attention prefill; the first answer token is the argmax of that forward's last logits;
each later token is one cached greedy step at its true position (the cache is shorter than the
sequence after compression, so positions are passed explicitly). No press acts during decoding.

A press changes nothing its prefill computes (each layer's cache is compressed after that layer has
attended over the full keys), so every press of an item is answered from one shared prefill: one hook
per attention layer hands each press its own copy of the layer's full keys and values and calls the
press's own `forward_hook` on it, as `with press(model)` would. A press that brings its own context
manager (overrides `__call__`) gets a prefill of its own. The tests check that both routes answer alike.

The model runs SDPA. A press that reads the prefill's attention weights (ObservedAttention) runs its
items under a kernel that returns them: transformers' eager kernel (`weights_kernel=eager`), or by
default the same arithmetic a block of query rows at a time (`query_blocked_eager.py`), which needs
one weights tensor instead of several and fits 16K prompts on a 24 GB machine. The tests check that
the two answer alike.

    .venv-kvpress/bin/python scripts/peers/kvpress_generate.py items=items.json out=answers.json \
        [shared=false] [threads=1] [weights_kernel=blocked|eager]

items.json: {"model": "<HF Llama folder>", "max_new_tokens": 8,
             "presses": [{"label": "snapkv@0.75", "press": "SnapKVPress",
                          "kwargs": {"compression_ratio": 0.75, "window_size": 64}}, ...],
             "items": [{"id": "...", "prompt_ids": [...]}, ...]}
answers.json: {"versions": {...}, "answers": {label: {id: {"ids": [...], "kept": [per layer],
               "stored_bytes": int}}}}  (kept: cached positions per layer after the prefill;
               stored_bytes: those K and V tensors' bytes)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from contextlib import contextmanager, nullcontext
from importlib.metadata import version
from pathlib import Path

OPTIONS = ("items", "out", "threads", "shared", "weights_kernel")
WEIGHT_PRESSES = ("ObservedAttentionPress",)  # presses that score keys by the prefill's attention weights


def fail(message: str) -> None:
    """Bad input: one line on stderr, exit 2 (the project's code for it)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse_options(argv: list[str]) -> dict[str, str]:
    """key=value options, each named in OPTIONS; anything else is one error line."""
    opts = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in OPTIONS:
            fail(f"expected key=value with a key in {OPTIONS}, got {arg!r}")
        opts[key] = value
    for key in ("items", "out"):
        if key not in opts:
            fail(f"missing {key}=...")
    return opts


def make_press(spec: dict):
    """A kvpress press by class name, from the names kvpress exports (never an arbitrary import)."""
    import kvpress

    name = spec["press"]
    cls = getattr(kvpress, name, None)
    if not (isinstance(cls, type) and name.endswith("Press")):
        fail(f"kvpress has no press named {name!r}")
    return cls(**spec.get("kwargs", {}))


def answer_one(model, press, prompt_ids: list[int], max_new_tokens: int) -> dict:
    """One press, its own prefill, through kvpress's context manager."""
    import torch
    from transformers import DynamicCache

    ids = torch.tensor([prompt_ids])
    cache = DynamicCache()
    with torch.inference_mode():
        with press(model):
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return continue_greedy(model, cache, out.logits[0, -1].argmax(), len(prompt_ids), max_new_tokens)


def needs_weights(press) -> bool:
    return type(press).__name__ in WEIGHT_PRESSES


@contextmanager
def attention_kernel(model, name: str):
    """Run the model under attention implementation `name`, then restore the one it had."""
    before = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(before)


def shares_prefill(press) -> bool:
    """Presses that act only through kvpress's per-layer forward hook (no context manager of their own)."""
    from kvpress.presses.base_press import BasePress

    return type(press).__call__ is BasePress.__call__


def answer_shared(model, presses: list, prompt_ids: list[int], max_new_tokens: int) -> list[dict]:
    """Every press of `presses` (each `shares_prefill`) answered from one prefill of the prompt."""
    import torch
    from transformers import DynamicCache

    caches = [DynamicCache() for _ in presses]

    def hook(module, args, kwargs, output):
        full, idx = kwargs["past_key_values"], module.layer_idx
        for press, cache in zip(presses, caches):
            cache.update(full.layers[idx].keys, full.layers[idx].values, idx)  # a copy of the full prefill
            press.forward_hook(module, args, {**kwargs, "past_key_values": cache}, output)
        return output

    for press in presses:
        press.post_init_from_model(model)
    hooks = []
    try:
        for layer in model.model.layers:
            layer.self_attn.rotary_emb = model.model.rotary_emb  # what kvpress's context manager sets
            hooks.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([prompt_ids]), past_key_values=DynamicCache(), use_cache=True,
                        logits_to_keep=1)
    finally:
        for h in hooks:
            h.remove()
    first = out.logits[0, -1].argmax()
    with torch.inference_mode():
        return [continue_greedy(model, cache, first, len(prompt_ids), max_new_tokens) for cache in caches]


def continue_greedy(model, cache, token, prompt_len: int, max_new_tokens: int) -> dict:
    """The answer from the prefill's argmax `token` on, and what the compressed cache held after the prefill."""
    import torch

    kept = [layer.keys.shape[-2] for layer in cache.layers]
    stored = sum(layer.keys.numel() * layer.keys.element_size()
                 + layer.values.numel() * layer.values.element_size() for layer in cache.layers)
    answer = [int(token)]
    for step in range(max_new_tokens - 1):
        position = torch.tensor([[prompt_len + step]])
        out = model(input_ids=token.view(1, 1), past_key_values=cache, position_ids=position, use_cache=True)
        token = out.logits[0, -1].argmax()
        answer.append(int(token))
    return {"ids": answer, "kept": kept, "stored_bytes": int(stored)}


def write_json_atomic(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def main(argv: list[str]) -> None:
    opts = parse_options(argv)
    try:
        spec = json.loads(Path(opts["items"]).read_text())
    except (OSError, ValueError) as exc:
        fail(f"cannot read items={opts['items']}: {exc}")
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # quiet by default: one line per press
    torch.set_num_threads(int(opts.get("threads", "1")))
    weights_kernel = opts.get("weights_kernel", "blocked")
    if weights_kernel not in ("blocked", "eager"):
        fail(f"weights_kernel must be blocked or eager, got {weights_kernel!r}")
    if weights_kernel == "blocked":
        from query_blocked_eager import NAME, make_kernel
        from transformers import AttentionInterface

        # every press consumes a layer's weights inside that layer's hook, so one buffer serves all layers
        AttentionInterface.register(NAME, make_kernel(reuse_weights=True))
        weights_kernel = NAME
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32, attn_implementation="sdpa").eval()
    out_path = Path(opts["out"])
    # A rerun continues: answers already written are kept, only missing (press, item) pairs run,
    # and the file is rewritten after every item.
    done = json.loads(out_path.read_text())["answers"] if out_path.exists() else {}
    presses = {p["label"]: make_press(p) for p in spec["presses"]}
    if opts.get("shared", "true") not in ("true", "false"):
        fail(f"shared must be true or false, got {opts['shared']!r}")
    shared = opts.get("shared", "true") == "true"
    versions = {k: version(k) for k in ("kvpress", "transformers", "torch")}
    for item in spec["items"]:
        todo = [label for label in presses if item["id"] not in done.get(label, {})]
        found = {}
        for weights in (False, True):  # SDPA's presses share one prefill, weight readers another
            group = [label for label in todo if needs_weights(presses[label]) == weights]
            together = [label for label in group if shared and shares_prefill(presses[label])]
            with attention_kernel(model, weights_kernel) if weights else nullcontext():
                if together:
                    found.update(zip(together, answer_shared(model, [presses[label] for label in together],
                                                             item["prompt_ids"], spec["max_new_tokens"])))
                for label in group:
                    if label not in found:
                        found[label] = answer_one(model, presses[label], item["prompt_ids"], spec["max_new_tokens"])
        for label in todo:
            done.setdefault(label, {})[item["id"]] = found[label]
        if todo:
            write_json_atomic(out_path, {"versions": versions, "answers": done})
            print(f"{item['id']}: {len(todo)} presses", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
