"""Run from the study's folder: PYTHONPATH=<checkout> python needle_heads.py (docs/results/retrofit/README.md §3).

Per (layer, head): attention mass the answering query (the prompt's last token) puts on the needle,
full causal softmax over q.k/sqrt(d), mean over the 15 trials at 2,048 tokens; for each seed's faithful
Standard and its g1 / g8 retrofits (for AnchorMass this is the uncompressed score: which head *would*
look at the needle; heads [0, n_local) are the local ones in AnchorMass)."""
import json
import math

import torch

from anchormass.data.tokenizer import Tokenizer
from anchormass.eval.items import Haystack, trial_grid
from anchormass.eval.suites.retrofit.slot_probe import probe_forward
from anchormass.training.checkpoint import load_model

torch.set_num_threads(1)
tok = Tokenizer.load("data/demo/tokenizer.model")
hay = Haystack(tok, filler="classic_en", lang="en")
trials = trial_grid([2048], [0.1, 0.3, 0.5, 0.7, 0.9], [0, 1, 2])
out = {}
for seed in (0, 1, 2):
    for run in ("standard_faithful/longctx_32k", "faithful_g1/retro_32k", "faithful_g8/retro_32k"):
        model, _ = load_model(f"runs/retrofit/seed{seed}/{run}/checkpoints/last.ckpt")
        model.eval()
        acc = None
        with torch.no_grad():
            for t in trials:
                ids = hay.build(t)
                lo, hi = hay.needle_span(t)
                qpos = len(ids) - 1
                _, qkv = probe_forward(model, torch.tensor([ids]), [qpos])
                per = []
                for layer in qkv:
                    q = layer.q[0, :, qpos]                      # [H, D]
                    k = layer.k[0, :, : qpos + 1]                # [H, T, D]
                    w = torch.softmax((k @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(q.shape[-1]), -1)
                    per.append(w[:, lo:hi].sum(-1))              # [H]
                m = torch.stack(per)                             # [L, H]
                acc = m if acc is None else acc + m
        out[f"seed{seed}/{run.split('/')[0]}"] = (acc / len(trials)).tolist()
        key = f"seed{seed}/{run.split('/')[0]}"
        print(key, [[round(x, 2) for x in row] for row in out[key]], flush=True)
json.dump(out, open("evals/heads/needle_heads.json", "w"), indent=1)
