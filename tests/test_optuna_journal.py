"""The sweep's study file (runs/optuna_journal.py): a second process opening it sees the same
trials, states, parameters and values; a half-written last line is ignored."""

import optuna

from anchormass.runs.optuna_journal import JournalStorage


def test_a_study_reopened_from_its_journal_is_the_same_study(tmp_path):
    path = tmp_path / "study.jsonl"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=JournalStorage(path), direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=0))
    study.optimize(lambda t: (t.suggest_float("x", -1, 1) - 0.3) ** 2 + t.suggest_int("n", 0, 4), n_trials=3)
    running = study.ask()
    running.set_user_attr("folder", "3")
    failed = study.ask()
    study.tell(failed, state=optuna.trial.TrialState.FAIL)
    with open(path, "a") as f:
        f.write('["set_trial_values", [3, ')   # killed mid-write

    again = optuna.load_study(study_name="s", storage=JournalStorage(path))
    before = [(t.number, t.state, t.params, t.values, t.user_attrs) for t in study.trials]
    after = [(t.number, t.state, t.params, t.values, t.user_attrs) for t in again.trials]
    assert after == before
    assert again.trials[3].state == optuna.trial.TrialState.RUNNING
    assert again.best_trial.number == study.best_trial.number
    again.tell(3, values=[0.0])   # the reopened study goes on
    assert optuna.load_study(study_name="s", storage=JournalStorage(path)).best_trial.number == 3
