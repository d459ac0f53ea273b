"""More next-item recommendation data for the :mod:`clbench.scenarios.movielens` protocol (leave-last-out, one
training window per user with ``windows="last"``, NDCG@10 / HIT@10 over ALL items, no item of the user's history
excluded from the ranking): Amazon "Games" (``games_seqrec``) and MovieLens-1M (``movielens1m_seqrec``), the two
datasets of Ding et al. (ICML 2024).

- **Amazon Games**: ``<data root>/amazon-games/Video.txt[.gz]``, Kang & McAuley's (SASRec) preprocessing: one
  ``user item`` pair a line (1-based integer ids, items ``1..23715``), each user's lines in time order. The file has
  no timestamps, so the line number serves as time: the user's order is exact, but there is no global time, and the
  scenario has one experience only (``n_experiences=1``; cutting periods by line number would cut by user).
- **MovieLens-1M**: ``<data root>/ml-1m/ratings.dat`` (GroupLens: ``user::item::rating::timestamp``), fetched only
  with downloads enabled (``--download``; the archive's md5 is checked). The same preprocessing as MovieLens-100k:
  every rating is an interaction, ordered by ``(timestamp, line)``; item ids are renumbered ``1..V`` in increasing
  order of the original ids (MovieLens-1M uses 3,706 of the ids up to 3,952; for MovieLens-100k, whose 1,682 ids are
  all used, the same map is the identity).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from clbench.data.catalog import DatasetSpec, Layout, SplitArrays, locate
from clbench.data.errors import DatasetNotFound
from clbench.protocol import NEXT_ITEM, Scenario
from clbench.registry import SCENARIOS
from clbench.scenarios.movielens import check_sequence_args, sequences_scenario

GAMES_ITEMS = 23_715
ML1M_URL = "https://files.grouplens.org/datasets/movielens/ml-1m.zip"
ML1M_ZIP_MD5 = "c4d9eecfca2ab87c1945afe126590906"


def _not_split(paths: dict[str, Path]) -> SplitArrays:
    raise TypeError("sequence data are read by clbench.scenarios.recommendation's readers, not catalog.load")


def download_movielens_1m(root: Path) -> None:
    """GroupLens' ``ml-1m.zip`` (md5 checked) extracted into ``root/ml-1m/`` (torchvision's download code)."""
    from torchvision.datasets.utils import download_and_extract_archive
    download_and_extract_archive(ML1M_URL, str(root), md5=ML1M_ZIP_MD5)


# content md5 of SASRec's data/Video.txt (decompressed when stored as Video.txt.gz)
AMAZON_GAMES = DatasetSpec("amazon-games", (
    Layout("amazon-games", {"Video.txt": "90ee83b589a4b2c2306bc8284214fdf5"}, _not_split, gzip_ok=True),
), how_to_get="download data/Video.txt from https://github.com/kang205/SASRec and place it (or Video.txt.gz) in "
              "<root>/amazon-games/")

# ratings.dat is not checked file by file: the download checks the archive's md5
MOVIELENS_1M = DatasetSpec("movielens-1m", (
    Layout("ml-1m", {"ratings.dat": None}, _not_split, gzip_ok=True),
), download=download_movielens_1m)


def _table(path: Path, sep: str, names: list[str]) -> np.ndarray:
    """The integer columns ``names`` of a text table; a malformed file is refused with one line."""
    try:
        table = pd.read_csv(path, sep=sep, header=None, names=names, dtype=np.int64, engine="python")
    except (ValueError, pd.errors.ParserError) as err:
        raise DatasetNotFound(f"{path}: not a table of {len(names)} integer columns ({' '.join(names)}) separated "
                              f"by {sep!r} ({str(err).splitlines()[0]}); replace it with the official file.") from err
    if table.isna().any().any() or len(table) == 0:
        raise DatasetNotFound(f"{path}: empty or with missing fields; replace it with the official file.")
    return table.to_numpy()


def read_games(path: Path) -> np.ndarray:
    """``(N, 4)`` ``user, item, rating, time`` rows of a SASRec ``user item`` file: rating 1, time = line number."""
    pairs = _table(path, " ", ["user", "item"])
    n = len(pairs)
    return np.column_stack([pairs, np.ones(n, dtype=np.int64), np.arange(n, dtype=np.int64)])


def read_movielens_1m(path: Path) -> tuple[np.ndarray, int]:
    """``(N, 4)`` ``user, item, rating, timestamp`` rows of ``ratings.dat`` with items renumbered ``1..V`` in
    increasing order of their original ids, and ``V``."""
    rows = _table(path, "::", ["user", "item", "rating", "timestamp"])
    ids, rows[:, 1] = np.unique(rows[:, 1], return_inverse=True)
    rows[:, 1] += 1
    return rows, len(ids)


GAMES_INTERACTIONS = 287_107           # lines of Video.txt
MOVIELENS_1M_INTERACTIONS = 1_000_209  # rows of ratings.dat


def _check_games(*, n_experiences: int = 1, **args: object) -> None:
    """What ``games_seqrec`` refuses, known from its arguments (its ``check_args``: checked when a suite loads)."""
    check_sequence_args(interactions=GAMES_INTERACTIONS, n_experiences=n_experiences, **args)
    if n_experiences != 1:
        raise ValueError(f"games_seqrec has one experience only (Video.txt has no timestamps to cut time periods "
                         f"by), got n_experiences={n_experiences}.")


@SCENARIOS.register("games_seqrec")
def games_seqrec(*, seed: int = 0, n_experiences: int = 1, max_len: int = 50, holdout: str = "test",
                 windows: str = "last", data_root: str | None = None) -> Scenario:
    """Next-item prediction on Amazon Games (31,013 users, 23,715 items): each user's last item held out, NDCG@10 /
    HIT@10 over all items. ``n_experiences`` must be 1 (the file has no global time); ``max_len``, ``holdout`` and
    ``windows`` as in ``movielens_seqrec`` (default ``last``: one training window per user, the unit of user-level
    privacy). The data do not depend on ``seed``."""
    _check_games(n_experiences=n_experiences, max_len=max_len, holdout=holdout, windows=windows)
    _, paths = locate(AMAZON_GAMES, data_root)
    return sequences_scenario(read_games(paths["Video.txt"]), 1, max_len, holdout, windows, GAMES_ITEMS,
                              name="games_seqrec")


games_seqrec.kind = NEXT_ITEM           # what it builds, read when a suite loads (clbench.protocol.scenario_kind)
games_seqrec.check_args = _check_games


@SCENARIOS.register("movielens1m_seqrec")
def movielens1m_seqrec(*, seed: int = 0, n_experiences: int = 1, max_len: int = 200, holdout: str = "test",
                       windows: str = "last", data_root: str | None = None) -> Scenario:
    """Next-item prediction on MovieLens-1M (6,040 users, 3,706 items), MovieLens-100k's protocol (equal-size time
    periods with ``n_experiences > 1``); ``max_len`` defaults to SASRec's 200 for MovieLens-1M. The data do not
    depend on ``seed``."""
    check_sequence_args(interactions=MOVIELENS_1M_INTERACTIONS, n_experiences=n_experiences, max_len=max_len,
                        holdout=holdout, windows=windows)
    _, paths = locate(MOVIELENS_1M, data_root)
    rows, n_items = read_movielens_1m(paths["ratings.dat"])
    return sequences_scenario(rows, n_experiences, max_len, holdout, windows, n_items, name="movielens1m_seqrec")


movielens1m_seqrec.kind = NEXT_ITEM
movielens1m_seqrec.check_args = partial(check_sequence_args, interactions=MOVIELENS_1M_INTERACTIONS)


__all__ = ["AMAZON_GAMES", "GAMES_ITEMS", "MOVIELENS_1M", "games_seqrec", "movielens1m_seqrec", "read_games",
           "read_movielens_1m"]
