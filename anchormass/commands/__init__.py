"""The command-line entry points, one module each: `python train.py` / `anchormass-train`,
`python evaluate.py` / `anchormass-eval`, and scripts/run_curriculum.py, prepare_data.py,
export_hf.py and import_hf.py / `anchormass-curriculum`, `-prepare`, `-export`, `-import` call the
same `cli()` here.
Empty on purpose: importing one command must not import the others."""
