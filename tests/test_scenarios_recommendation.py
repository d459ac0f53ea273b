"""games_seqrec / movielens1m_seqrec: readers, the leave-last-out split and the ranking evaluator on hand-made files,
MovieLens-1M through the download code, bad or missing data refused with the data layer's errors; most_popular's
ranking by hand; the real Games file's counts."""

import gzip
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from clbench.data import ChecksumMismatch, DatasetNotFound, configure
from clbench.protocol import ScenarioInfo
from clbench.scenarios import recommendation
from clbench.scenarios.movielens import sequences_scenario
from clbench.scenarios.recommendation import games_seqrec, movielens1m_seqrec, read_games, read_movielens_1m
from clbench.strategies.popularity import (
    MostPopular,
    MostPopularConfig,
    RecentPopular,
    RecentPopularConfig,
    latest_per_user,
)

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


def test_most_popular_counts_the_training_interactions_by_hand(tmp_path):
    """GAMES' users hold out their last item; everything before it trains: user 1: 4, 2, 5; user 2: 5, 1; user 3: 2
    (each user's first item included, although it is never a target) -> counts 1:1, 2:2, 4:1, 5:2, 3:0; ties go to
    the lower id, so the ranking is 2, 5, 1, 4, 3 and the test items 2, 5, 3 have ranks 1, 2, 5:
    NDCG@10 = mean(1/log2 2, 1/log2 3, 1/log2 6), HIT@10 = 1."""
    path = tmp_path / "Video.txt"
    path.write_text(GAMES)
    scenario = sequences_scenario(read_games(path), 1, max_len=3, windows="last", n_items=5)
    assert scenario.train_stream[0].interactions.tolist() == [[0, 4], [0, 2], [0, 5], [1, 5], [1, 1], [2, 2]]
    strategy = MostPopular(scenario.info, torch.device("cpu"), MostPopularConfig())
    strategy.train(scenario.train_stream[0])
    scores = strategy.predict(torch.zeros(2, 3, dtype=torch.long), None)
    assert scores.shape == (2, 5) and torch.equal(scores[0], scores[1])
    assert scores[0].argsort(descending=True).tolist() == [1, 4, 0, 3, 2]           # items 2, 5, 1, 4, 3
    row = scenario.evaluator(strategy, scenario, 0, torch.device("cpu"))
    assert row.rows["ndcg@10"] == [pytest.approx((1 + 1 / np.log2(3) + 1 / np.log2(6)) / 3)]
    assert row.rows["hit@10"] == [1.0]
    strategy.train(scenario.train_stream[0])                        # a second experience adds its counts
    assert strategy.popularity.counts[1:].tolist() == [2.0, 4.0, 0.0, 2.0, 4.0] and strategy.num_parameters().total == 5


def test_the_validation_holdout_leaves_the_last_two_items_out_of_the_counts(tmp_path):
    path = tmp_path / "Video.txt"
    path.write_text(GAMES)
    scenario = sequences_scenario(read_games(path), 1, max_len=3, holdout="valid", n_items=5)
    assert scenario.train_stream[0].interactions.tolist() == [[0, 4], [0, 2], [1, 5]]


@pytest.mark.parametrize("n_recent, ranking", [(1, [0, 1, 4, 2, 3]),      # latest items 5, 1, 2: items 1, 2, 5, 3, 4
                                               (2, [1, 4, 0, 2, 3])])     # 2, 5 | 5, 1 | 2: items 2, 5, 1, 3, 4
def test_recent_popular_counts_each_users_latest_training_items_by_hand(tmp_path, n_recent, ranking):
    path = tmp_path / "Video.txt"
    path.write_text(GAMES)
    scenario = sequences_scenario(read_games(path), 1, max_len=3, windows="last", n_items=5)
    strategy = RecentPopular(scenario.info, torch.device("cpu"), RecentPopularConfig(n_recent=n_recent))
    strategy.train(scenario.train_stream[0])
    assert strategy.predict(torch.zeros(1, 3, dtype=torch.long), None)[0].argsort(descending=True).tolist() == ranking


def test_recent_popular_keeps_the_latest_items_over_experiences():
    """Two periods: user 0's latest item moves from 3 to 4 in the second, user 1 has nothing new (its 2 stays)."""
    strategy = RecentPopular(ScenarioInfo("s", 2, (3,), extra={"n_items": 5, "training_interactions": True}),
                             torch.device("cpu"), RecentPopularConfig(n_recent=1))
    strategy.train(SimpleNamespace(interactions=torch.tensor([[0, 1], [1, 2], [0, 3]])))
    assert strategy.popularity.counts[1:].tolist() == [0.0, 1.0, 1.0, 0.0, 0.0]
    strategy.train(SimpleNamespace(interactions=torch.tensor([[0, 4]])))
    assert strategy.popularity.counts[1:].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert latest_per_user(np.array([[1, 5], [0, 1], [1, 6], [0, 2], [1, 7]]), 2).tolist() == \
        [[0, 1], [1, 6], [0, 2], [1, 7]]


def test_a_floor_refuses_a_scenario_without_training_interactions():
    with pytest.raises(ValueError, match="carry their interactions"):
        RecentPopular(ScenarioInfo("split_digits", 5, (64,)), torch.device("cpu"), RecentPopularConfig())


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
needs_games = pytest.mark.skipif(not REAL.exists(), reason="Amazon Games is not on this machine")


@pytest.fixture(scope="module")
def real_games():
    return games_seqrec(data_root=REAL.parent.parent)


@needs_games
def test_real_games_counts(real_games):
    train, test = real_games.train_stream[0].dataset, real_games.test_stream[0].dataset
    assert len(test) == 31_013 - 30                     # users with one action have no test item
    assert len(train) == 30_901                         # users with at least 3 actions have a target
    assert int((train.y > 0).sum()) == 212_861          # the latest <= 50 targets of each user (windows: last)
    assert int(test.y.max()) < 23_715 and real_games.info.extra["n_items"] == 23_715


def independent_floor_ndcg(counted) -> float:
    """NDCG@10 of a popularity ranking counted straight from Video.txt, without the scenario's code: each user's
    last line is the test item, ``counted(items before it)`` the items the user adds to the counts; items ranked
    by count, ties to the lower id; users with one line have no test item."""
    users = defaultdict(list)
    with gzip.open(REAL, "rt") as f:
        for line in f:
            user, item = line.split()
            users[user].append(int(item))
    counts = Counter(i for items in users.values() if len(items) > 1 for i in counted(items[:-1]))
    order = sorted(range(1, 23_716), key=lambda i: (-counts[i], i))
    rank = {item: r for r, item in enumerate(order[:10])}
    tests = [items[-1] for items in users.values() if len(items) > 1]
    return sum(1 / np.log2(rank[i] + 2) for i in tests if i in rank) / len(tests)


@needs_games
@pytest.mark.parametrize("strategy, counted", [
    (lambda info: MostPopular(info, torch.device("cpu"), MostPopularConfig()), lambda history: history),
    (lambda info: RecentPopular(info, torch.device("cpu"), RecentPopularConfig()), lambda history: history[-1:]),
], ids=["most_popular", "recent_popular"])
def test_real_games_floors_match_an_independent_count(real_games, strategy, counted):
    floor = strategy(real_games.info)
    floor.train(real_games.train_stream[0])
    ndcg = real_games.evaluator(floor, real_games, 0, torch.device("cpu")).rows["ndcg@10"][0]
    assert ndcg == pytest.approx(independent_floor_ndcg(counted), abs=5e-4)
