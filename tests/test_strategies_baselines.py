"""strategies/baselines.py: dark experience replay's replay batch (joined to the minibatch after the bridge
augmented it) goes through the scenario's batch augmentation; its stored logits were computed on the untransformed
samples in eval mode and stay so; evaluation never augments."""

from tests._buffer_augment import assert_buffer_augmented, assert_evaluation_untouched, recorded_run

DER = ("der_dark", (("mem_size", 8), ("batch_size_mem", 4)))


def test_der_replay_batch_is_augmented_and_its_logits_stored_from_untransformed_samples():
    assert_buffer_augmented(recorded_run(*DER), eval_mode_marks=0)


def test_der_evaluation_is_not_augmented():
    assert_evaluation_untouched(recorded_run(*DER))
