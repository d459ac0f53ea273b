"""strategies/regularization.py: the importance passes that read data see the scenario's batch augmentation once,
as they saw the dataset's per-sample train transform before the image scenarios declared it as a batch augmentation:
online EWC's Fisher pass and MAS's importance pass over the experience's training data, RWalk's per-iteration
gradient (on the augmented minibatch; Avalanche's RWalk trains in eval mode); evaluation never augments."""

import pytest

from tests._buffer_augment import assert_evaluation_untouched, assert_training_augmented_once, recorded_run

# inputs each experience's training forwards (24 samples, one epoch), per mode: the training forward plus the
# importance pass (EWC: eval mode; MAS: train mode; RWalk: its gradient and the training forward, both eval mode)
FORWARDED = {"ewc_online": {"T": 24, "E": 24}, "mas": {"T": 48}, "rwalk": {"E": 48}}


@pytest.mark.parametrize("name", sorted(FORWARDED))
def test_importance_pass_sees_the_augmentation_once(name):
    assert_training_augmented_once(recorded_run(name, ()), FORWARDED[name])


@pytest.mark.parametrize("name", sorted(FORWARDED))
def test_evaluation_is_not_augmented(name):
    assert_evaluation_untouched(recorded_run(name, ()))
