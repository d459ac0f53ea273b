"""games_seqrec / movielens1m_seqrec: readers, the leave-last-out split and the ranking evaluator on hand-made files,
MovieLens-1M through the download code, bad or missing data refused with the data layer's errors; most_popular's
ranking by hand; the real Games file's counts."""

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from clbench.data import ChecksumMismatch, DatasetNotFound, configure
from clbench.scenarios import recommendation
from clbench.scenarios.movielens import sequences_scenario
from clbench.scenarios.recommendation import games_seqrec, movielens1m_seqrec, read_games, read_movielens_1m
from clbench.strategies.popularity import MostPopular, MostPopularConfig

# SASRec format: "user item", each user's lines in time order (users 1..3)
GAMES = "1 4\n1 2\n1 5\n1 2\n2 5\n2 1\n2 5\n3 2\n3 3\n"
# user::item::rating::timestamp; original item ids 10, 30, 7 -> 2, 3, 1 (increasing order of the ids)
ML1M = "1::10::5::300\n1::30::3::100\n1::7::4::200\n2::30::1::50\n2::7::2::60\n2::10::2::70\n"


def rows_of(dataset):
    return [(x.tolist(), y.tolist() if y.ndim else int(y)) for x, y, _ in dataset]


def test_games_file_is_read_in_line_order_and_split_leave_last_out(tmp_path):
    path = tmp_path / "Video.txt"
    path.write_text(GAMES)
    rows = read_games(path)
    assert rows[:, 0].tolist() == [1, 1, 1, 1, 2, 2, 2, 3, 3] and rows[:, 3].tolist() == list(range(9))
    scenario = sequences_scenario(rows, 1, max_len=3, windows="last", n_items=5, name="games_seqrec")
    # test item = each user's last item (0-based column), history = the items before it
    assert rows_of(scenario.test_stream[0].dataset) == [([4, 2, 5], 1), ([0, 5, 1], 4), ([0, 0, 2], 2)]
    # one window per user; user 3 (2 items) has no training target (its first item is never one)
    assert rows_of(scenario.train_stream[0].dataset) == [([0, 4, 2], [0, 2, 5]), ([0, 0, 5], [0, 0, 1])]
    assert scenario.info.name == "games_seqrec" and scenario.info.extra["n_items"] == 5


def test_most_popular_ranks_training_targets_by_count_by_hand(tmp_path):
    """Training targets of GAMES (L = 3, windows last): items 2, 5, 1 once each -> counts 1:1, 2:1, 5:1, others 0;
    ties go to the lower id, so the ranking is 1, 2, 5, 3, 4 and the test items 2, 5, 3 (columns 1, 4, 2) have
    ranks 1, 2, 3: NDCG@10 = mean(1/log2 3, 1/log2 4, 1/log2 5), HIT@10 = 1, and HIT@2 = 2/3."""
    path = tmp_path / "Video.txt"
    path.write_text(GAMES)
    scenario = sequences_scenario(read_games(path), 1, max_len=3, windows="last", n_items=5)
    strategy = MostPopular(scenario.info, torch.device("cpu"), MostPopularConfig())
    strategy.train(scenario.train_stream[0])
    scores = strategy.predict(torch.zeros(2, 3, dtype=torch.long), None)
    assert scores.shape == (2, 5) and torch.equal(scores[0], scores[1])
    assert scores[0].argsort(descending=True).tolist() == [0, 1, 4, 2, 3]           # items 1, 2, 5, 3, 4
    row = scenario.evaluator(strategy, scenario, 0, torch.device("cpu"))
    assert row.rows["ndcg@10"] == [pytest.approx((1 / np.log2(3) + 1 / np.log2(4) + 1 / np.log2(5)) / 3)]
    assert row.rows["hit@10"] == [1.0]
    strategy.train(scenario.train_stream[0])                        # a second experience adds its counts
    assert strategy.popularity.counts[[1, 2, 5]].tolist() == [2.0, 2.0, 2.0] and strategy.num_parameters().total == 5


def test_games_scenario_refuses_periods_and_a_wrong_or_missing_file(tmp_path, monkeypatch):
    monkeypatch.setenv("CLBENCH_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="no timestamps"):
        games_seqrec(n_experiences=2, data_root=tmp_path)
    with pytest.raises(DatasetNotFound, match="(?s)amazon-games.*kang205/SASRec"):
        games_seqrec(data_root=tmp_path)
    (tmp_path / "amazon-games").mkdir()
    with gzip.open(tmp_path / "amazon-games" / "Video.txt.gz", "wt") as f:
        f.write(GAMES)
    with pytest.raises(ChecksumMismatch, match="content md5"):
        games_seqrec(data_root=tmp_path)


def test_movielens_1m_renumbers_items_and_is_split_by_time(tmp_path, monkeypatch):
    monkeypatch.setenv("CLBENCH_DATA", str(tmp_path / "nowhere"))
    (tmp_path / "ml-1m").mkdir()
    (tmp_path / "ml-1m" / "ratings.dat").write_text(ML1M)
    rows, n_items = read_movielens_1m(tmp_path / "ml-1m" / "ratings.dat")
    assert n_items == 3 and rows[:, 1].tolist() == [2, 3, 1, 3, 1, 2]
    scenario = movielens1m_seqrec(data_root=tmp_path, max_len=2)
    # user 1 by time: 30, 7, 10 -> 3, 1, 2; user 2: 30, 7, 10 -> 3, 1, 2
    assert rows_of(scenario.test_stream[0].dataset) == [([3, 1], 1), ([3, 1], 1)]
    assert rows_of(scenario.train_stream[0].dataset) == [([0, 3], [0, 1]), ([0, 3], [0, 1])]
    assert scenario.info.name == "movielens1m_seqrec" and scenario.info.extra["n_items"] == 3


def test_movielens_1m_is_fetched_only_with_downloads_enabled(tmp_path, monkeypatch):
    """Without --download: the data layer's not-found error offering it; with it: GroupLens' archive through
    torchvision's download code (md5 checked), here replaced by a stub that extracts the hand-made file."""
    monkeypatch.setenv("CLBENCH_DATA", str(tmp_path / "root"))
    fetched = []

    def fake_download(url, download_root, md5):
        fetched.append((url, md5))
        (Path(download_root) / "ml-1m").mkdir(parents=True)
        (Path(download_root) / "ml-1m" / "ratings.dat").write_text(ML1M)

    monkeypatch.setattr("torchvision.datasets.utils.download_and_extract_archive", fake_download)
    with pytest.raises(DatasetNotFound, match="rerun with --download"):
        movielens1m_seqrec()
    assert fetched == []
    configure(download=True)
    try:
        scenario = movielens1m_seqrec(max_len=2)
    finally:
        configure(download=False)
    assert fetched == [(recommendation.ML1M_URL, recommendation.ML1M_ZIP_MD5)]
    assert len(scenario.test_stream[0].dataset) == 2


def test_a_malformed_file_gets_one_line(tmp_path):
    (tmp_path / "ml-1m").mkdir()
    (tmp_path / "ml-1m" / "ratings.dat").write_text("1::10::5::300\n1::x::3\n")
    with pytest.raises(DatasetNotFound, match=r"not a table of 4 integer columns .*replace it") as err:
        movielens1m_seqrec(data_root=tmp_path)
    assert "\n" not in str(err.value)


REAL = Path("/work/shared/data/amazon-games/Video.txt.gz")


@pytest.mark.skipif(not REAL.exists(), reason="Amazon Games is not on this machine")
def test_real_games_counts():
    scenario = games_seqrec(data_root=REAL.parent.parent)
    train, test = scenario.train_stream[0].dataset, scenario.test_stream[0].dataset
    assert len(test) == 31_013 - 30                     # users with one action have no test item
    assert len(train) == 30_901                         # users with at least 3 actions have a target
    assert int((train.y > 0).sum()) == 212_861          # the latest <= 50 targets of each user (windows: last)
    assert int(test.y.max()) < 23_715 and scenario.info.extra["n_items"] == 23_715
