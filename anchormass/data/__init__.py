"""Data pipeline (docs/method.md §4): tokenizer, token files, prepared dataset folders, step-indexed DataModules.

Preparing a dataset (scripts/prepare_data.py is the CLI):
    prepare.py           data config -> data/<name>/: picks the kind's writer, runs it in a staged folder
    pretrain_writer.py   kind pretrain: documents -> tokenizer -> train.bin / val.bin
    sft_writer.py        kind sft: Alpaca records -> chat-template tokens + loss mask + offsets
    longctx_writer.py    kind longctx: retrieval examples over a prepared pretrain folder (sft layout)
    staged_folder.py     build beside the target, rename into place when complete; one build at a time
    sources.py           corpora through `datasets` (local files, hub); corpus_files.py reads their format
    cleaners.py          text cleaners chosen by name (html_text.py: HTML pages); demo_corpus.py the demo text
    dedup.py             repeated paragraphs dropped across a corpus before its split
    parallel_encode.py   cleaning + tokenising with N worker processes, in corpus order
    split_writer.py      the seeded train/val split, written as documents arrive
    shards.py, merge.py  a corpus prepared on K machines, and the merge into one folder
    sft.py               the chat template, Alpaca records, response-only loss masks
    longctx.py, mqar.py  long-context retrieval examples; multi-query associative recall items
Reading one:
    tokenizer_loader.py  load_tokenizer(path), behind tokenizer_base.py's interface:
    tokenizer.py         SentencePiece with reserved pad/unk/bos/eos and chat-role ids (the default), or
    hf_tokenizer.py      an imported Hugging Face tokenizer folder (chat_template.py renders its template)
    token_file.py        uint16 .bin + JSON sidecar; open_tokens() validates
    dataset_dir.py       a prepared folder: meta.json, read_metadata(), fingerprint()
    sampler.py           the global order: step k -> sample ids, rank/micro-batch slicing
    samples.py, loader.py, datamodule.py   sample sets, loaders, LightningDataModules
    testing.py           tiny prepared datasets for tests
"""
