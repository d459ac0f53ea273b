"""strategies/baselines.py: dark experience replay's replay batch (joined to the minibatch after the bridge
augmented it) goes through the scenario's batch augmentation; its stored logits were computed on the untransformed
samples in eval mode and stay so; iCaRL's exemplars are augmented once, as the new data; EWC's Fisher pass sees the
augmentation once; evaluation never augments."""

from tests._buffer_augment import (
    assert_buffer_augmented,
    assert_evaluation_untouched,
    assert_training_augmented_once,
    recorded_run,
)

DER = ("der_dark", (("mem_size", 8), ("batch_size_mem", 4)))


def test_der_replay_batch_is_augmented_and_its_logits_stored_from_untransformed_samples():
    assert_buffer_augmented(recorded_run(*DER), eval_mode_marks=0)


def test_der_evaluation_is_not_augmented():
    assert_evaluation_untouched(recorded_run(*DER))


ICARL = ("icarl", (("mem_size", 16),))


def test_icarl_exemplars_are_augmented_once_as_the_new_data():
    """iCaRL's exemplars, joined to the experience's data, go through the batch augmentation once per training
    forward, as in the authors' code (ICaRLStrategy's docstring); herding and the class means read the untransformed
    samples in eval mode."""
    assert_buffer_augmented(recorded_run(*ICARL), eval_mode_marks=0)


def test_icarl_evaluation_is_not_augmented():
    assert_evaluation_untouched(recorded_run(*ICARL))


def test_ewc_fisher_pass_sees_the_augmentation_once():
    """EWC's Fisher pass over the experience's 24 training samples (eval mode) reads them augmented once, as the
    per-sample train transform gave them; the training forwards too."""
    assert_training_augmented_once(recorded_run("ewc", ()), {"T": 24, "E": 24})


def test_ewc_evaluation_is_not_augmented():
    assert_evaluation_untouched(recorded_run("ewc", ()))
