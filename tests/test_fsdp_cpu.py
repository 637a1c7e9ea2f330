"""trainer=fsdp on CPU: the pinned torch / Lightning cannot shard on CPU, so the run is refused in one
line that names the source lines imposing it, and those lines still say so in the installed packages
(an upgrade that lifts the limit fails this test instead of leaving a stale message)."""

import subprocess
from pathlib import Path

import lightning
import pytest
import torch

from anchormass.training.strategies import FSDP_ON_CPU

from _train_helpers import FAST, REPO, subprocess_env, tiny_datasets, train_cmd


def _source_line(package, relative: str, line: int, count: int = 1) -> str:
    """Lines [line, line + count) (1-based) of an installed package's file."""
    return "\n".join((Path(package.__file__).parent / relative).read_text().splitlines()[line - 1:line - 1 + count])


def test_cited_source_lines_are_the_limitation():
    assert lightning.__version__ in FSDP_ON_CPU and torch.__version__.split("+")[0].rsplit(".", 1)[0] in FSDP_ON_CPU
    guard = _source_line(lightning, "pytorch/trainer/connectors/accelerator_connector.py", 431, 4)
    assert guard.lstrip().startswith("if (")  # the statement the message cites, refusing unless cuda/gpu
    assert "type(self._strategy_flag) is FSDPStrategy" in guard and 'in ("cuda", "gpu")' in guard
    assert "device_id=self.root_device.index" in _source_line(lightning, "pytorch/strategies/fsdp.py", 315)
    assert 'determined_device.type == "cpu"' in _source_line(torch, "distributed/fsdp/_init_utils.py", 389)


@pytest.mark.slow  # one train.py process: ~10 s idle, 20 s on a busy 2-core machine
def test_fsdp_on_cpu_is_one_line_exit_2(tmp_path):
    data = tiny_datasets(tmp_path / "data")
    out = tmp_path / "run"
    over = ["model=anchormass_tiny", f"data_dir={data['pretrain']}", *FAST, "trainer=fsdp", "trainer.accelerator=cpu",
            "trainer.devices=2", "trainer.precision=32-true"]
    proc = subprocess.run(train_cmd(over, out), cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: {FSDP_ON_CPU}"] and "Traceback" not in proc.stderr
    assert "accelerator_connector.py:431" in errors[0] and "trainer=ddp_cpu" in errors[0]
    assert not (out / "checkpoints").exists() and not (out / "train_result.json").exists()
