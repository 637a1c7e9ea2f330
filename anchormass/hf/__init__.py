"""Hugging Face interoperability: export checkpoints as `transformers` folders and run
lm-evaluation-harness tasks on them.

    export.py             `export_checkpoint(ckpt, out)`: picks the exporter by architecture
    export_llama.py       Standard -> a native LlamaForCausalLM folder (no custom code)
    export_anchormass.py  AnchorMass -> a trust_remote_code folder delegating to this package
    modeling.py           the PreTrainedModel / PretrainedConfig the remote-code folder loads
    cache_adapter.py      our fixed-budget session cache behind the transformers `Cache` interface
    tokenizer_export.py   our SentencePiece model as an `AutoTokenizer` folder (same ids)
    provenance.py         the source checkpoint's sha256 and the git commit, written into the folder
    lm_eval_tasks.py      harness task configs: `jcqa_local` (the harness's JCommonsenseQA on local files)

`transformers`, `safetensors` and `lm_eval` are imported only by these modules, so the rest of
the package works without them.
"""
