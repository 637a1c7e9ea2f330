"""An Optuna study kept in a file: every change to the study is one appended JSON line, and
opening the file replays them into Optuna's in-memory storage.

Why not Optuna's own RDB storage: with the pinned optuna 2.10 (the Hydra plugin needs optuna < 3)
it does not run against SQLAlchemy 2, and Optuna's JournalStorage only exists from 3.1. One sweep
launcher writes the file; the Hydra plugin tells results from that process, so no cross-process
locking is needed (the sweep folder's trials are claimed one by one as run folders are).

A line is written (and fsynced) only after the change succeeded in memory, so a killed sweep
leaves a prefix of its history: at worst a half-written last line, which is ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.storages import InMemoryStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState, create_trial

from anchormass.errors import DataError


def _trial_to_json(trial: FrozenTrial | None) -> dict | None:
    if trial is None:
        return None
    return {"state": trial.state.value, "values": trial.values, "params": trial.params,
            "distributions": {k: distribution_to_json(d) for k, d in trial.distributions.items()},
            "user_attrs": trial.user_attrs, "system_attrs": trial.system_attrs,
            "intermediate_values": {str(k): v for k, v in trial.intermediate_values.items()}}


def _trial_from_json(raw: dict | None) -> FrozenTrial | None:
    if raw is None:
        return None
    return create_trial(state=TrialState(raw["state"]), values=raw["values"], params=raw["params"],
                        distributions={k: json_to_distribution(d) for k, d in raw["distributions"].items()},
                        user_attrs=raw["user_attrs"], system_attrs=raw["system_attrs"],
                        intermediate_values={int(k): v for k, v in raw["intermediate_values"].items()})


# The operations the journal writes (each a method below) and how many arguments each line holds.
REPLAYED = {"create_new_study": 1, "delete_study": 1, "set_study_directions": 2, "set_study_user_attr": 3,
            "set_study_system_attr": 3, "create_new_trial": 2, "set_trial_state": 2, "set_trial_param": 4,
            "set_trial_values": 2, "set_trial_intermediate_value": 3, "set_trial_user_attr": 3,
            "set_trial_system_attr": 3}


class JournalStorage(InMemoryStorage):
    """`optuna.create_study(storage=JournalStorage(path), load_if_exists=True)` continues the study
    that earlier processes wrote to `path`: same trials, same numbers, same states."""

    def __init__(self, path: str | os.PathLike):
        super().__init__()
        self.path = Path(path)
        self._file = None
        if self.path.is_file():
            raw = self.path.read_bytes()
            whole = raw[: raw.rfind(b"\n") + 1]
            for number, line in enumerate(whole.decode("utf-8", errors="replace").splitlines(), 1):
                self._replay(line, number)
            if len(whole) < len(raw):  # the half-written last line of a killed sweep: dropped
                with open(self.path, "r+b") as f:
                    f.truncate(len(whole))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def __getstate__(self) -> dict:  # pickled with a launcher's job: the copy does not write
        state = super().__getstate__()
        state.pop("_file", None)
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._file = None

    def _replay(self, line: str, number: int) -> None:
        """One line of the file, applied; a line that is not one of the operations this class
        writes, with the arguments it writes, is refused naming the file and line (a method name
        read from a file is never looked up on the storage)."""
        try:
            op, args = json.loads(line)
            if op not in REPLAYED or not isinstance(args, list) or len(args) != REPLAYED[op]:
                raise ValueError(f"not an operation of this journal: {str(op)[:60]!r}")
            self._apply(op, args)
        except Exception as err:  # noqa: BLE001 - whatever a damaged line makes Optuna raise
            raise DataError(f"{self.path} line {number} is not a study record ({type(err).__name__}: "
                            f"{str(err).splitlines()[0][:200] if str(err) else '-'}); the study cannot be "
                            f"continued from it: move the file aside to start the sweep over") from None

    def _apply(self, op: str, args: list) -> Any:
        if op == "create_new_trial":
            return super().create_new_trial(args[0], _trial_from_json(args[1]))
        if op == "set_study_directions":
            return super().set_study_directions(args[0], [StudyDirection(d) for d in args[1]])
        if op == "set_trial_state":
            return super().set_trial_state(args[0], TrialState(args[1]))
        if op == "set_trial_param":
            return super().set_trial_param(args[0], args[1], args[2], json_to_distribution(args[3]))
        if op == "set_trial_intermediate_value":
            return super().set_trial_intermediate_value(args[0], int(args[1]), args[2])
        return getattr(InMemoryStorage, op)(self, *args)  # op is one of REPLAYED: checked by _replay

    def _record(self, op: str, *args) -> None:
        if self._file is None:
            return
        self._file.write(json.dumps([op, list(args)]) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def _logged(self, op: str, *args) -> Any:
        result = self._apply(op, list(args))
        self._record(op, *args)
        return result

    def create_new_study(self, study_name: str | None = None) -> int:
        return self._logged("create_new_study", study_name)

    def delete_study(self, study_id: int) -> None:
        self._logged("delete_study", study_id)

    def set_study_directions(self, study_id: int, directions: Sequence[StudyDirection]) -> None:
        values = [int(d.value) for d in directions]
        self._logged("set_study_directions", study_id, values)

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self._logged("set_study_user_attr", study_id, key, value)

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self._logged("set_study_system_attr", study_id, key, value)

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        raw = _trial_to_json(template_trial)
        return self._logged("create_new_trial", study_id, raw)

    def set_trial_state(self, trial_id: int, state: TrialState) -> bool:
        return self._logged("set_trial_state", trial_id, state.value)

    def set_trial_param(self, trial_id: int, param_name: str, param_value_internal: float, distribution) -> None:
        raw = distribution_to_json(distribution)
        args = [trial_id, param_name, param_value_internal, raw]
        self._logged("set_trial_param", *args)

    def set_trial_values(self, trial_id: int, values: Sequence[float]) -> None:
        self._logged("set_trial_values", trial_id, list(values))

    def set_trial_intermediate_value(self, trial_id: int, step: int, intermediate_value: float) -> None:
        args = [trial_id, step, intermediate_value]
        self._logged("set_trial_intermediate_value", *args)

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._logged("set_trial_user_attr", trial_id, key, value)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._logged("set_trial_system_attr", trial_id, key, value)
