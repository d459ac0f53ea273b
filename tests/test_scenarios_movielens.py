"""movielens_seqrec: sequence order (stable ties), leave-last-out, time periods and windows on a hand-built u.data;
the real file's counts; missing or corrupted data refused before any work."""

from pathlib import Path

import numpy as np
import pytest
import torch

from clbench.data import ChecksumMismatch, DatasetNotFound
from clbench.registry import SCENARIOS
from clbench.scenarios.movielens import movielens_seqrec, read_interactions, sequences_scenario, user_sequences

# user, item, rating, timestamp -- in file order. User 1 rates items 10 and 12 at the same time (file order: 10 first).
ROWS = np.array([
    (1, 10, 5, 100),
    (2, 20, 1, 10),
    (1, 11, 3, 50),
    (2, 21, 2, 300),
    (1, 12, 4, 100),
    (2, 22, 3, 20),
    (1, 13, 1, 200),
    (1, 14, 2, 5),
    (1, 15, 2, 6),
])
# user 1: 14 15 11 10 12 13; user 2: 20 22 21. Global order: 14 15 20 22 11 | 10 12 13 21 (ranks 0-4 | 5-8 for K=2).


def rows_of(dataset):
    return [(x.tolist(), y.tolist() if y.ndim else int(y)) for x, y, _ in dataset]


def test_sequences_by_time_with_ties_in_file_order_and_periods_of_equal_size():
    seqs = user_sequences(ROWS, 2)
    assert [s.items.tolist() for s in seqs] == [[14, 15, 11, 10, 12, 13], [20, 22, 21]]
    assert [s.periods.tolist() for s in seqs] == [[0, 0, 0, 1, 1, 1], [0, 0, 1]]
    assert [s.periods.tolist() for s in user_sequences(ROWS, 1)] == [[0] * 6, [0] * 3]


def test_leave_last_out_is_the_papers_protocol_for_one_experience():
    scenario = sequences_scenario(ROWS, 1, max_len=3, n_items=30)
    # test: each user's last item (as a 0-based column: item - 1), after its previous 3 items, left-padded
    assert rows_of(scenario.test_stream[0].dataset) == [([11, 10, 12], 12), ([0, 20, 22], 20)]
    # training: every other position t >= 1 is a target exactly once; windows taken back from the last target
    assert rows_of(scenario.train_stream[0].dataset) == [
        ([15, 11, 10], [11, 10, 12]),       # user 1, targets at positions 2..4
        ([0, 0, 14], [0, 0, 15]),           # position 0 (item 14) is never a target; positions < 0 are padding
        ([0, 0, 20], [0, 0, 22]),           # user 2: target 22; 21 is held out
    ]
    assert scenario.info.extra["n_items"] == 30 and scenario.info.input_shape == (3,)
    last = sequences_scenario(ROWS, 1, max_len=3, windows="last", n_items=30)     # one window per user
    assert rows_of(last.train_stream[0].dataset) == [([15, 11, 10], [11, 10, 12]), ([0, 0, 20], [0, 0, 22])]
    assert [s.name for s in scenario.evaluator.specs] == ["ndcg@10", "hit@10"]


def test_every_target_once_and_held_out_items_never_targets_for_short_windows():
    scenario = sequences_scenario(ROWS, 1, max_len=1, n_items=30)
    train = rows_of(scenario.train_stream[0].dataset)
    assert sorted(train) == sorted([([14], [15]), ([15], [11]), ([11], [10]), ([10], [12]), ([20], [22])])
    # validation holdout: the second-to-last item is evaluated; the last is neither target nor test item
    valid = sequences_scenario(ROWS, 1, max_len=2, holdout="valid", n_items=30)
    assert rows_of(valid.test_stream[0].dataset) == [([11, 10], 11), ([0, 20], 21)]
    targets = {v for _, y in rows_of(valid.train_stream[0].dataset) for v in y if v}
    assert targets == {15, 11, 10}


def test_periods_train_on_their_own_interactions_and_test_on_their_last_item():
    scenario = sequences_scenario(ROWS, 2, max_len=3, n_items=30)
    assert rows_of(scenario.test_stream[0].dataset) == [([0, 14, 15], 10), ([0, 0, 20], 21)]
    assert rows_of(scenario.test_stream[1].dataset) == [([11, 10, 12], 12), ([0, 20, 22], 20)]
    assert rows_of(scenario.train_stream[0].dataset) == [([0, 0, 14], [0, 0, 15])]
    # period 1: history from period 0 is input, but period 0's items (11 = its held-out item) are not targets
    assert rows_of(scenario.train_stream[1].dataset) == [([15, 11, 10], [0, 10, 12])]
    assert [e.dataset.t for e in scenario.train_stream] == [0, 1]
    with pytest.raises(ValueError, match="use fewer n_experiences"):
        sequences_scenario(ROWS, 4, max_len=3, n_items=30)


def test_bad_arguments_and_item_ids_are_refused():
    with pytest.raises(ValueError, match="holdout must be one of"):
        movielens_seqrec(holdout="last")
    with pytest.raises(ValueError, match="windows one of"):
        movielens_seqrec(windows="first")
    with pytest.raises(ValueError, match="item ids must lie in 1..12"):
        sequences_scenario(ROWS, 1, max_len=3, n_items=12)


def test_missing_data_names_the_folder_and_a_wrong_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("CLBENCH_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(DatasetNotFound, match="movielens-100k"):
        movielens_seqrec(data_root=tmp_path)
    (tmp_path / "movielens-100k").mkdir()
    np.savetxt(tmp_path / "movielens-100k" / "u.data", ROWS, fmt="%d", delimiter="\t")
    assert read_interactions(tmp_path / "movielens-100k" / "u.data").tolist() == ROWS.tolist()
    with pytest.raises(ChecksumMismatch, match="content md5"):
        movielens_seqrec(data_root=tmp_path)


REAL = Path("/work/shared/data/movielens-100k/u.data.gz")


@pytest.mark.skipif(not REAL.exists(), reason="MovieLens-100k is not on this machine")
def test_real_movielens_counts():
    scenario = movielens_seqrec(data_root=REAL.parent.parent, n_experiences=1, max_len=50)
    train, test = scenario.train_stream[0].dataset, scenario.test_stream[0].dataset
    assert len(test) == 943                                          # one test item per user
    assert int((train.y > 0).sum()) == 100_000 - 943 - 943           # all but the test item and the first item
    assert int(test.y.min()) >= 0 and int(test.y.max()) < 1682
    three = movielens_seqrec(data_root=REAL.parent.parent, n_experiences=3, max_len=50)
    targets = sum(int((e.dataset.y > 0).sum()) for e in three.train_stream)
    tests = sum(len(e.dataset) for e in three.test_stream)
    assert targets + tests + 943 == 100_000                          # each interaction: target, test or first
    assert all(torch.equal(e.dataset.x[:, -1] > 0, torch.ones(len(e.dataset), dtype=torch.bool))
               for e in three.test_stream)                           # every test user has history


def test_the_sequence_scenarios_refuse_in_python_what_the_loader_refuses():
    from clbench.scenarios.movielens import check_sequence_args

    for args in ({"n_experiences": 50_001}, {"holdout": "train"}, {"max_len": 0}):
        with pytest.raises(ValueError):
            SCENARIOS.get("movielens_seqrec")(**args)
        with pytest.raises(ValueError):
            check_sequence_args(interactions=100_000, **args)
    check_sequence_args(interactions=100_000, n_experiences=50_000)
    with pytest.raises(ValueError, match="one experience only"):
        SCENARIOS.get("games_seqrec")(n_experiences=2)
