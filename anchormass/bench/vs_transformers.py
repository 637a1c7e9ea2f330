"""Speed on a real model's weights: our Standard against `transformers`' Llama on the same
weights, threads and prompts, and AnchorMass (made from those weights) decoding at a fixed size.

Per prompt length, timed in alternation (a, b, c, a, b, c, ...) so that load from other processes
hits every method alike (measure.time_interleaved); medians and their ratios are reported:
- prefill: our Standard fed the whole prompt in one forward (as `transformers` is), AnchorMass in
  its prefill chunks, `transformers` one forward with a DynamicCache;
- decode: ms per greedy token after that prefill (the cache grows by the tokens of each repeat,
  a few dozen on thousands);
- the physical floor of a decoded token here: the bytes it must read (every weight once, plus the
  cache it attends to) over this machine's measured read bandwidth at the same thread count.
A decode step reads all weights whatever the context, so at these lengths both models sit near the
same floor; what separates them is the cache term, which grows with the context for the Standard
and stops growing for AnchorMass.
"""

from __future__ import annotations

import statistics
import time

import torch

from anchormass.bench import measure, workloads
from anchormass.bench.report import markdown_table


def read_bandwidth(n_bytes: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes per second one `sum` over an fp32 buffer of `n_bytes` streams from memory (median)."""
    x = torch.ones(n_bytes // 4)
    x.sum()  # touch every page once
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t0)
    return n_bytes / statistics.median(times)


def weight_bytes(model) -> int:
    """Bytes of every parameter (`parameters()` yields a tied LM head once: it is the embedding)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def hf_prefill(hf, ids: torch.Tensor):
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.inference_mode():
        out = hf(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    return cache, out.logits[:, -1].argmax(-1, keepdim=True)


def hf_decode(hf, cache, token: torch.Tensor, n_tokens: int) -> torch.Tensor:
    with torch.inference_mode():
        for _ in range(n_tokens):
            out = hf(input_ids=token, cache=cache, use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
    return token


def compare(standard, hf, anchormass, lengths: list[int], repeats: int, decode_tokens: int, seed: int = 0,
            on_length=None) -> dict:
    """The rows of the comparison (one per length) and the machine's measured read bandwidth.
    `hf`: `transformers`' LlamaForCausalLM holding `standard`'s weights (hf.export_llama.llama_from_ours)."""
    device = "cpu"
    bandwidth = read_bandwidth()
    w_std, w_am = weight_bytes(standard), weight_bytes(anchormass)
    am_chunk = anchormass.cfg.prefill_chunk
    rows = []
    # one warm-up of every path on a short prompt (lazy init, first allocations)
    warm = workloads.random_ids(standard.cfg.vocab_size, 1, 128, seed, device)
    workloads.decode(standard, workloads.prefill(standard, warm, None, None, 128)[0], warm[:, -1:], 2)
    workloads.decode(anchormass, workloads.prefill(anchormass, warm, None, None, 128)[0], warm[:, -1:], 2)
    hf_decode(hf, hf_prefill(hf, warm)[0], warm[:, -1:], 2)
    for length in lengths:
        ids = workloads.random_ids(standard.cfg.vocab_size, 1, length, seed, device)
        sessions = {}

        def ours_prefill():
            sessions["ours"] = workloads.prefill(standard, ids, None, None, length)

        def am_prefill():
            sessions["anchormass"] = workloads.prefill(anchormass, ids, None, None, am_chunk)

        def transformers_prefill():
            sessions["transformers"] = hf_prefill(hf, ids)

        pre = measure.time_interleaved({"ours": ours_prefill, "transformers": transformers_prefill,
                                        "anchormass": am_prefill}, device, 0, repeats)
        same_token = bool(torch.equal(sessions["ours"][1], sessions["transformers"][1]))
        dec = measure.time_interleaved({
            "ours": lambda: workloads.decode(standard, *sessions["ours"], decode_tokens),
            "transformers": lambda: hf_decode(hf, *sessions["transformers"], decode_tokens),
            "anchormass": lambda: workloads.decode(anchormass, *sessions["anchormass"], decode_tokens),
        }, device, 0, repeats)
        cache_std = sessions["ours"][0].stored_nbytes
        cache_am = sessions["anchormass"][0].stored_nbytes
        row = {"length": length, "same_first_token": same_token,
               "prefill_s": {k: t.to_dict() for k, t in pre.items()},
               "decode_ms_per_token": {k: 1e3 * t.median / decode_tokens for k, t in dec.items()},
               "decode_cpu_ms_per_token": {k: 1e3 * t.cpu_median / decode_tokens for k, t in dec.items()},
               "decode_s": {k: t.to_dict() for k, t in dec.items()},
               "cache_bytes": {"standard": cache_std, "anchormass": cache_am},
               "floor_ms_per_token": {"standard": 1e3 * (w_std + cache_std) / bandwidth,
                                      "anchormass": 1e3 * (w_am + cache_am) / bandwidth}}
        rows.append(row)
        if on_length is not None:
            on_length(row)
    return {"bandwidth_bytes_per_s": bandwidth, "weight_bytes": w_std, "decode_tokens": decode_tokens,
            "repeats": repeats, "threads": torch.get_num_threads(), "rows": rows,
            "anchormass": {"label": anchormass.cfg.name, "group_size": anchormass.cfg.group_size,
                           "global_heads": anchormass.cfg.n_global_heads, "chunk": am_chunk}}


def train_steps(standard, hf, length: int, repeats: int, compiled: bool = False, seed: int = 0,
                anchormass=None) -> dict:
    """One training step (forward, loss, backward; no optimizer update) on [1, length]: ours in fp32,
    ours under bf16 autocast, ours through torch.compile (optional: compiling costs minutes on CPU),
    transformers in fp32; with `anchormass` (a model on the same weights) also the two retrofit designs'
    steps (training/objectives.py): end to end (next-token loss through AnchorMass, fp32 and bf16
    autocast) and layer-local attention transfer from `standard` as the teacher (fp32 and bf16).
    Interleaved medians, and each step's loss on the same batch."""
    from anchormass.training.objectives import attention_transfer_loss

    ids = workloads.random_ids(standard.cfg.vocab_size, 1, length, seed, "cpu")
    losses = {}

    def ours(model=standard, bf16_autocast=False, name="ours"):
        def step():
            losses[name] = workloads.train_step(model, ids, bf16_autocast)
        return step

    def theirs():
        loss = hf(input_ids=ids, labels=ids).loss  # transformers shifts the labels itself
        loss.backward()
        hf.zero_grad(set_to_none=True)
        losses["transformers"] = float(loss.detach())

    def transfer(bf16_autocast=False, name="attention_transfer"):
        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16_autocast):
                loss, _ = attention_transfer_loss(anchormass, standard, ids)
            loss.backward()
            anchormass.zero_grad(set_to_none=True)
            losses[name] = float(loss.detach())
        return step

    fns = {"ours": ours(), "transformers": theirs,
           "ours_bf16_autocast": ours(bf16_autocast=True, name="ours_bf16_autocast")}
    if compiled:
        fns["ours_compiled"] = ours(torch.compile(standard), name="ours_compiled")
    if anchormass is not None:
        fns.update({"anchormass_lm": ours(anchormass, name="anchormass_lm"),
                    "anchormass_lm_bf16_autocast": ours(anchormass, True, "anchormass_lm_bf16_autocast"),
                    "attention_transfer": transfer(),
                    "attention_transfer_bf16_autocast": transfer(True, "attention_transfer_bf16_autocast")})
    times = measure.time_interleaved(fns, "cpu", 1, repeats)  # the warm-up also compiles
    return {"length": length, "steps_s": {k: t.to_dict() for k, t in times.items()}, "loss": losses}


HEADER = ["length", "prefill ours s", "prefill transformers s", "ratio", "prefill AnchorMass s", "decode ours ms/tok",
          "decode transformers ms/tok", "ratio", "decode AnchorMass ms/tok", "floor ms/tok (Standard / AnchorMass)",
          "cache MiB (Standard / AnchorMass)", "same first token"]


def report(result: dict) -> str:
    """The comparison as markdown: medians, ratios, the floor; then the training steps, if timed."""
    lines = compare_report(result) if result["rows"] else []
    if result.get("train"):
        t = result["train"]
        base = t["steps_s"]["ours"]["median_s"]
        cells = [f"{name} {v['median_s']:.1f} s (x{v['median_s'] / base:.2f}, CPU x"
                 f"{v['cpu_median_s'] / t['steps_s']['ours']['cpu_median_s']:.2f}; loss {t['loss'][name]:.4f})"
                 for name, v in t["steps_s"].items()]
        repeats = len(t["steps_s"]["ours"]["times_s"])
        lines.append(f"Training step (forward + loss + backward, no update) on 1 x {t['length']:,} tokens, medians of "
                     f"{repeats} interleaved repeats, times relative to ours in fp32: " + "; ".join(cells) + ".")
    return "\n\n".join(lines) + "\n"


def compare_report(result: dict) -> list[str]:
    rows = []
    for r in result["rows"]:
        p, d, f = r["prefill_s"], r["decode_ms_per_token"], r["floor_ms_per_token"]
        rows.append([f"{r['length']:,}", f"{p['ours']['median_s']:.2f}", f"{p['transformers']['median_s']:.2f}",
                     f"{p['ours']['median_s'] / p['transformers']['median_s']:.2f}",
                     f"{p['anchormass']['median_s']:.2f}",
                     f"{d['ours']:.1f}", f"{d['transformers']:.1f}", f"{d['ours'] / d['transformers']:.2f}",
                     f"{d['anchormass']:.1f}", f"{f['standard']:.1f} / {f['anchormass']:.1f}",
                     f"{r['cache_bytes']['standard'] / 2**20:,.1f} / {r['cache_bytes']['anchormass'] / 2**20:,.1f}",
                     "yes" if r["same_first_token"] else "NO"])
    first, last = result["rows"][0], result["rows"][-1]
    flat = {k: last["decode_ms_per_token"][k] / first["decode_ms_per_token"][k]
            for k in ("ours", "transformers", "anchormass")}
    a = result["anchormass"]
    table = markdown_table(HEADER, rows)
    cpu = []
    for r in result["rows"]:
        pre, dec = r["prefill_s"], r["decode_cpu_ms_per_token"]
        cpu.append(f"{r['length']:,}: prefill x{pre['ours']['cpu_median_s'] / pre['transformers']['cpu_median_s']:.2f}"
                   f", decode x{dec['ours'] / dec['transformers']:.2f}")
    lines = ["\n".join(table),
             "Ours over transformers on process CPU time (closer to an idle machine's wall time when other "
             "jobs share the cores): " + "; ".join(cpu) + ".",
             f"Decode time per token, {last['length']:,} over {first['length']:,} tokens: ours x{flat['ours']:.2f}, "
             f"transformers x{flat['transformers']:.2f}, AnchorMass x{flat['anchormass']:.2f}.",
             f"Medians of {result['repeats']} interleaved repeats, {result['threads']} torch thread(s), fp32, one "
             f"sequence of random token ids per length (the same for every method); decode: "
             f"{result['decode_tokens']} greedy tokens per repeat. Floor: (weights "
             f"{result['weight_bytes'] / 2**20:,.0f} MiB + cache) / measured read bandwidth "
             f"{result['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s. AnchorMass: "
             f"{a['label']} ({a['global_heads']} global query heads per layer, G={a['group_size']}), prefilled in "
             f"chunks of {a['chunk']}."]
    return lines
