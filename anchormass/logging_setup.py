"""How much of a run reaches the console: `verbose=0` (quiet), `1` (default) or `2` (everything).

Libraries talk a lot during a training run: Lightning's device report, tips and model summary,
and deprecation warnings from torch and Lightning internals. None of it is about the run, so at
the default level it goes only to the run's log file (Hydra's `<run folder>/train.log`), and the
console keeps the progress bar, our own messages and errors. Nothing is dropped: the log file
gets every record at every level.

- 0: no progress bar; the console shows errors only (plus the entry point's final line).
- 1: progress bar, our own messages, and errors from anywhere.
- 2: everything, as the libraries print it (the curriculum runs stages this way and sends their
     whole output to each stage's log file).
"""

from __future__ import annotations

import logging
import os

from omegaconf import DictConfig, open_dict

from anchormass.errors import ConfigError

LEVELS = (0, 1, 2)
# Loggers whose records are ours; every other logger is a library's.
OWN_LOGGERS = ("anchormass", "__main__")
# Libraries that install their own console handler at import time, bypassing the root logger.
SELF_HANDLED = ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric")


def check_verbose(value) -> int:
    if isinstance(value, bool) or value not in LEVELS:
        raise ConfigError(f"verbose must be 0 (quiet), 1 (default) or 2 (everything), got {value!r}")
    return int(value)


class ConsoleFilter(logging.Filter):
    """Passes what the console should show at a verbosity level; file handlers are left alone."""

    def __init__(self, verbose: int):
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        if self.verbose >= 2 or record.levelno >= logging.ERROR:
            return True
        return self.verbose == 1 and record.name.split(".")[0] in OWN_LOGGERS


def _is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)


def route_library_output(verbose: int) -> None:
    """Send library log records and Python warnings through the root logger's handlers (set up
    by Hydra's job logging), with the console ones filtered by `verbose`."""
    logging.captureWarnings(True)  # warnings become records of the `py.warnings` logger
    for name in SELF_HANDLED:
        lib = logging.getLogger(name)
        for handler in list(lib.handlers):
            if _is_console(handler):
                lib.removeHandler(handler)
        lib.propagate = True
    root = logging.getLogger()
    for handler in root.handlers:
        if _is_console(handler):
            for old in [f for f in handler.filters if isinstance(f, ConsoleFilter)]:
                handler.removeFilter(old)
            handler.addFilter(ConsoleFilter(verbose))
    if not root.handlers:  # no job logging configured (no log file): the console alone, filtered
        console = logging.StreamHandler()
        console.addFilter(ConsoleFilter(verbose))
        root.addHandler(console)
        root.setLevel(logging.INFO)


def apply_verbosity(cfg: DictConfig) -> int:
    """For train.py: check `cfg.verbose`, route library output, and drop the progress bar when quiet."""
    verbose = check_verbose(cfg.get("verbose", 1))
    route_library_output(verbose)
    if verbose == 0 and "trainer" in cfg:
        with open_dict(cfg):
            cfg.trainer.enable_progress_bar = False
    if verbose == 0:
        # wandb prints its banners to the terminal itself, past the logging filters; its own switch.
        os.environ["WANDB_SILENT"] = "true"
    return verbose
