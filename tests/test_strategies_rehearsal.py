"""strategies/rehearsal.py: the memory samples that A-GEM, GEM, ER-ACE and ER-AML forward in training outside the
bridged minibatch go through the scenario's batch augmentation (as the dataset's per-sample train transform acted on
them before the image scenarios declared it as a batch augmentation); GSS's replayed memory rows carry the
augmentation once (it stores the minibatch rows before the augmentation); feature replay's stored features are
computed from augmented samples; evaluation never augments."""

import pytest

from tests._buffer_augment import (
    assert_buffer_augmented,
    assert_evaluation_untouched,
    assert_training_augmented_once,
    recorded_run,
)

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


# a memory larger than the first experience: GSS fills it, then replaces rows while the second is learnt
GSS = ("gss", (("mem_size", 40), ("mem_strength", 1)))
FEATURE_REPLAY = ("feature_replay", (("mem_size", 8), ("batch_size_mem", 4)))


def test_gss_replayed_rows_carry_one_augmentation():
    """GSS's memory rows, replayed in the second experience's minibatches (which the bridge augments), carry the
    augmentation once, as a stored row carried its per-sample transform once; its selection forwards (eval mode) of
    the minibatch and of the memory subsets see it once too. Storing the augmented minibatch rows gave replayed rows
    two or three marks."""
    assert_buffer_augmented(recorded_run(*GSS), eval_mode_marks=1)


def test_feature_replay_stores_features_of_augmented_samples():
    """Feature replay's stored features are computed (eval mode) from the experience's 24 training samples
    augmented once, as through the per-sample train transform."""
    assert_training_augmented_once(recorded_run(*FEATURE_REPLAY), {"T": 24, "E": 24})


@pytest.mark.parametrize("run", [GSS, FEATURE_REPLAY], ids=["gss", "feature_replay"])
def test_gss_and_feature_replay_evaluation_is_not_augmented(run):
    assert_evaluation_untouched(recorded_run(*run))
