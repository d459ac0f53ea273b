"""strategies/rehearsal.py: the memory samples that A-GEM, GEM, ER-ACE and ER-AML forward in training outside the
bridged minibatch go through the scenario's batch augmentation (as the dataset's per-sample train transform acted on
them before the image scenarios declared it as a batch augmentation); evaluation never does."""

import pytest

from tests._buffer_augment import assert_buffer_augmented, assert_evaluation_untouched, recorded_run

# er_aml: each class buffer holds >= batch_size samples (its positives/negatives batches)
ARGS = {"agem": {"patterns_per_exp": 4, "sample_size": 4}, "gem": {"patterns_per_exp": 4},
        "er_ace": {"mem_size": 8, "batch_size_mem": 4}, "er_aml": {"mem_size": 16, "batch_size_mem": 4}}


@pytest.mark.parametrize("name", sorted(ARGS))
def test_memory_samples_forwarded_in_training_are_augmented_once(name):
    """A-GEM's reference batch, GEM's stored memory, ER-ACE's replay batch, ER-AML's replay and positive/negative
    batches: every input of a training forward carries the augmentation's mark exactly once."""
    assert_buffer_augmented(recorded_run(name, tuple(ARGS[name].items())))


@pytest.mark.parametrize("name", sorted(ARGS))
def test_evaluation_is_not_augmented(name):
    assert_evaluation_untouched(recorded_run(name, tuple(ARGS[name].items())))
