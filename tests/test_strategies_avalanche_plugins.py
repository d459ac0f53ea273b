"""strategies/avalanche_plugins.py: MIR's candidates, MER's memory batch and BiC's held-out samples (its bias-layer
training, the backbone in eval mode) go through the scenario's batch augmentation in training; evaluation never
does."""

import pytest

from tests._buffer_augment import assert_buffer_augmented, assert_evaluation_untouched, recorded_run

ARGS = {"mir": {"mem_size": 8, "subsample": 6, "batch_size_mem": 2},
        "mer": {"mem_size": 8, "batch_size_mem": 4, "n_inner_steps": 1},
        "bic": {"mem_size": 20, "val_percentage": 0.25, "stage_2_epochs": 1}}
EVAL_MODE = {"bic": 1}      # stage 2 (and the previous model's distillation forward) run the backbone in eval mode


@pytest.mark.parametrize("name", sorted(ARGS))
def test_memory_samples_forwarded_in_training_are_augmented_once(name):
    assert_buffer_augmented(recorded_run(name, tuple(ARGS[name].items())), eval_mode_marks=EVAL_MODE.get(name))


@pytest.mark.parametrize("name", sorted(ARGS))
def test_evaluation_is_not_augmented(name):
    assert_evaluation_untouched(recorded_run(name, tuple(ARGS[name].items())))
