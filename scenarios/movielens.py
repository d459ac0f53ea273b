"""Next-item recommendation on MovieLens-100k (``movielens_seqrec``): per-user item sequences ordered by time,
leave-last-out evaluation (NDCG@10 and HIT@10 over all 1,682 items), one experience or a continual stream of
time periods.

Data: ``<data root>/movielens-100k/u.data[.gz]`` (GroupLens' file: ``user item rating timestamp``, tab-separated,
100,000 lines; every rating counts as an interaction, as in SASRec). Items keep their ids ``1..1682``; ``0`` is
padding.

**Order.** Interactions are ordered by ``(timestamp, line of the file)``: equal timestamps keep the file's order
(a stable sort), the same order globally and within each user's sequence ``s_u = (s_u[0], s_u[1], ...)``.

**Periods.** With ``n_experiences = K`` the interactions, in that global order, are cut into ``K`` consecutive
periods of equal size: the interaction of global rank ``r`` (0-based, of ``N``) lies in period ``⌊r·K/N⌋``. Within
each user's sequence the periods are therefore non-decreasing.

**Held-out item (leave-last-out per period).** For every user ``u`` and period ``k`` in which ``u`` has
interactions, the evaluation position ``e_{u,k}`` is ``u``'s LAST interaction in period ``k`` (``holdout="test"``)
or the second-to-last one (``holdout="valid"``: the validation protocol of SASRec; the last one is then neither a
target nor evaluated, it only appears later as history). ``e_{u,k}`` must have at least one earlier interaction
(``e ≥ 1``), else ``(u, k)`` has no test sample. With ``K = 1`` this is exactly the paper's protocol: each user's
last item is the test item, everything before it trains.

- Training experience ``k``: every position ``t ≥ 1`` of a user's sequence in period ``k`` that is not held out is a
  target, predicted from the items before it (history from earlier periods included). A user's targets are covered
  by windows of ``max_len`` consecutive positions, taken back from the last target: a sample is
  ``x = s_u[b-L .. b-1]`` (``(L,)`` item ids, left-padded with 0) and ``y = s_u[b-L+1 .. b]`` (``(L,)`` next items,
  0 where a position is not a target of this experience), for ``b = last, last - L, ...`` while it covers a target.
  Every target is in exactly one window. With ``windows="last"`` only the first of them (the latest ``L``
  targets) is kept: SASRec's truncation, one training sample per user and period.
- Every training experience also carries ``interactions`` ``(N, 2)``: the ``(user, item)`` rows of period ``k``
  that are not held out, each user's in time order (:func:`training_interactions`; the popularity floors count
  them: the targets leave out each user's first item, and ``windows="last"`` the items before the last window).
- Test experience ``k``: one sample per user with an evaluation position in period ``k``:
  ``x = s_u[e-L .. e-1]`` (left-padded) and ``y = s_u[e] - 1``: the evaluator's column ``c`` is item ``c + 1``
  (a strategy's ``predict`` returns ``(B, 1682)`` scores of items ``1..1682``).

So ``R[i, j]`` is NDCG@10 (HIT@10) on period ``j``'s held-out items after training on periods ``0..i``: ``j < i``
measures forgetting of earlier periods, ``j = i`` the period just trained, ``j > i`` prediction of a later period's
last item.
Held-out items of earlier periods are never targets; they are history (model inputs) in later periods, as they
would be in deployment.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset

from clbench.data.catalog import DatasetSpec, Layout, SplitArrays, locate
from clbench.evaluation import RankingEvaluator
from clbench.protocol import NEXT_ITEM, Scenario, ScenarioInfo
from clbench.registry import SCENARIOS

N_ITEMS = 1682
HOLDOUTS = ("test", "valid")
WINDOWS = ("all", "last")
INTERACTIONS = 100_000                  # rows of u.data


def check_sequence_args(*, interactions: int, n_experiences: int = 1, max_len: int = 50, holdout: str = "test",
                        windows: str = "all", **_: object) -> None:
    """What a sequence scenario over ``interactions`` rows refuses, known from its arguments and the data's size:
    the factories call it, and a suite checks it when it loads (the factories' ``check_args``). A time period needs
    at least two interactions (a training target and a held-out one), so ``n_experiences`` is at most half the
    interactions; a period left without a training window or a test user is found when the data are cut."""
    if holdout not in HOLDOUTS or windows not in WINDOWS:
        raise ValueError(f"holdout must be one of {HOLDOUTS} and windows one of {WINDOWS}; got {holdout!r}, "
                         f"{windows!r}.")
    if n_experiences < 1 or max_len < 1:
        raise ValueError(f"n_experiences and max_len must be positive, got {n_experiences} and {max_len}.")
    if n_experiences > interactions // 2:
        raise ValueError(f"n_experiences {n_experiences}: {interactions:,} interactions make at most "
                         f"{interactions // 2:,} time periods (each needs a training target and a held-out item); "
                         f"use fewer.")


def _not_split(paths: dict[str, Path]) -> SplitArrays:
    raise TypeError("movielens-100k is read with clbench.scenarios.movielens.read_interactions, not catalog.load")


# content md5 of the official u.data (decompressed when stored as u.data.gz)
MOVIELENS_100K = DatasetSpec("movielens-100k", (
    Layout("movielens-100k", {"u.data": "6e47046882bad158b0efbb84cd5cb987"}, _not_split, gzip_ok=True),
    Layout("ml-100k", {"u.data": "6e47046882bad158b0efbb84cd5cb987"}, _not_split, gzip_ok=True),
), how_to_get="download ml-100k.zip from https://grouplens.org/datasets/movielens/100k/ and place u.data "
              "(or u.data.gz) in <root>/movielens-100k/")


def read_interactions(path: Path) -> np.ndarray:
    """``(N, 4)`` int64 ``user, item, rating, timestamp`` rows of a ``u.data`` file (gzip or plain), file order."""
    table = pd.read_csv(path, sep="\t", header=None, names=["user", "item", "rating", "timestamp"], dtype=np.int64)
    return table.to_numpy()


class Sequences(Dataset):
    """``(x, y, t)`` samples of experience ``t``: ``x`` ``(L,)`` item ids (0 = padding) and ``y`` — ``(L,)`` next
    items (0 = no target) for training, a 0-based item column for testing."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, t: int) -> None:
        self.x, self.y, self.t = x, y, t

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], self.t

    def eval(self) -> Sequences:
        """The same dataset (no transforms to switch, unlike Avalanche's datasets' ``eval()``)."""
        return self


@dataclass(frozen=True)
class UserSequence:
    """One user's items ``(n,)`` in time order and the period ``(n,)`` of each interaction."""

    items: np.ndarray
    periods: np.ndarray


def user_sequences(rows: np.ndarray, n_periods: int) -> list[UserSequence]:
    """The sequences of every user (sorted by user id), cut into ``n_periods`` equal-size time periods."""
    order = np.lexsort((np.arange(len(rows)), rows[:, 3]))          # by timestamp, then file line (stable)
    period = np.empty(len(rows), dtype=np.int64)
    period[order] = np.arange(len(rows)) * n_periods // len(rows)
    rank = np.empty(len(rows), dtype=np.int64)
    rank[order] = np.arange(len(rows))
    by_user = np.lexsort((rank, rows[:, 0]))                        # user, then global time rank
    users, starts = np.unique(rows[by_user, 0], return_index=True)
    bounds = list(starts[1:]) + [len(rows)]
    return [UserSequence(rows[by_user[a:b], 1], period[by_user[a:b]]) for a, b in zip(starts, bounds)]


def _window(items: np.ndarray, end: int, length: int) -> np.ndarray:
    """``items[end-length .. end-1]`` left-padded with 0 to ``(length,)``."""
    out = np.zeros(length, dtype=np.int64)
    part = items[max(0, end - length): end]
    out[length - len(part):] = part
    return out


def split_user(seq: UserSequence, period: int, holdout: str) -> tuple[np.ndarray, int | None]:
    """Target positions of ``seq`` in ``period`` (sorted) and its evaluation position (None: no test sample)."""
    positions = np.flatnonzero(seq.periods == period)
    if len(positions) == 0:
        return positions, None
    dropped = 1 if holdout == "test" else 2
    e = int(positions[-dropped]) if len(positions) >= dropped else None
    targets = positions[:-dropped] if len(positions) > dropped else positions[:0]
    return targets[targets >= 1], (e if e is not None and e >= 1 else None)


def training_interactions(sequences: list[UserSequence], period: int, holdout: str) -> np.ndarray:
    """``(N, 2)`` ``(user, item)`` rows, each user's in time order (``user`` = its index in ``sequences``): the
    interactions of ``period`` that are not held out, i.e. everything before the evaluation position (and, with
    ``holdout="valid"``, the last item, neither target nor evaluated, left out too). Unlike the training targets it
    includes each user's first item; it is what a count of "training interactions" (popularity floors) counts."""
    dropped = 1 if holdout == "test" else 2
    parts = []
    for user, seq in enumerate(sequences):
        positions = np.flatnonzero(seq.periods == period)[:-dropped]
        parts.append(np.column_stack([np.full(len(positions), user, dtype=np.int64), seq.items[positions]]))
    return np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)


def period_samples(sequences: list[UserSequence], period: int, max_len: int, holdout: str,
                   windows: str = "all") -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Training windows ``(x (M, L), y (M, L))`` and test samples ``(x (U, L), y (U,))`` of one period;
    ``windows="last"`` keeps only each user's last window."""
    train_x, train_y, test_x, test_y = [], [], [], []
    for seq in sequences:
        targets, e = split_user(seq, period, holdout)
        if e is not None:
            test_x.append(_window(seq.items, e, max_len))
            test_y.append(seq.items[e] - 1)
        if len(targets) == 0:
            continue
        is_target = np.zeros(len(seq.items) + 1, dtype=bool)
        is_target[targets] = True
        ends = range(int(targets[-1]), int(targets[0]) - 1, -max_len)
        for b in ends if windows == "all" else ends[:1]:
            train_x.append(_window(seq.items, b, max_len))
            y = _window(seq.items, b + 1, max_len)
            positions = np.arange(b + 1 - max_len, b + 1)
            y[~is_target[np.clip(positions, 0, None)]] = 0          # position 0 is never a target
            train_y.append(y)
    empty = np.zeros((0, max_len), dtype=np.int64)
    return ((np.stack(train_x) if train_x else empty, np.stack(train_y) if train_y else empty),
            (np.stack(test_x) if test_x else empty, np.array(test_y, dtype=np.int64)))


@SCENARIOS.register("movielens_seqrec")
def movielens_seqrec(*, seed: int = 0, n_experiences: int = 1, max_len: int = 50, holdout: str = "test",
                     windows: str = "all", data_root: str | None = None) -> Scenario:
    """Next-item prediction on MovieLens-100k: leave-last-out (per time period), NDCG@10 / HIT@10 over all items.
    ``n_experiences``: 1 = the paper's protocol, more = equal-size time periods (module docstring); ``max_len``: the
    model's sequence length ``L`` (SASRec's 50 for sparse data); ``holdout``: ``test`` or ``valid`` (the
    second-to-last item); ``windows``: ``all`` (every target once) or ``last`` (one window per user and period:
    SASRec's truncation to the latest ``L`` items, and one training sample per user, the unit of user-level
    privacy). The data do not depend on ``seed``."""
    check_sequence_args(interactions=INTERACTIONS, n_experiences=n_experiences, max_len=max_len, holdout=holdout,
                        windows=windows)
    _, paths = locate(MOVIELENS_100K, data_root)
    return sequences_scenario(read_interactions(paths["u.data"]), n_experiences, max_len, holdout, windows)


movielens_seqrec.kind = NEXT_ITEM       # what it builds, read when a suite loads (clbench.protocol.scenario_kind)
movielens_seqrec.check_args = partial(check_sequence_args, interactions=INTERACTIONS)


def sequences_scenario(rows: np.ndarray, n_experiences: int, max_len: int, holdout: str = "test",
                       windows: str = "all", n_items: int = N_ITEMS, name: str = "movielens_seqrec") -> Scenario:
    """The scenario ``name`` of any ``(N, 4)`` interaction table (``user, item, rating, timestamp``; items
    ``1..n_items``)."""
    if len(rows) == 0 or rows[:, 1].min() < 1 or rows[:, 1].max() > n_items:
        raise ValueError(f"item ids must lie in 1..{n_items} (0 is padding); got {len(rows)} interactions.")
    sequences = user_sequences(rows, n_experiences)
    train, test = [], []
    for k in range(n_experiences):
        (tx, ty), (vx, vy) = period_samples(sequences, k, max_len, holdout, windows)
        if len(ty) == 0 or len(vy) == 0:
            raise ValueError(f"period {k} of {n_experiences} has {len(ty)} training windows and {len(vy)} test "
                             f"users; use fewer n_experiences.")
        train.append(SimpleNamespace(dataset=Sequences(torch.from_numpy(tx), torch.from_numpy(ty), k),
                                     current_experience=k,
                                     interactions=torch.from_numpy(training_interactions(sequences, k, holdout))))
        test.append(SimpleNamespace(dataset=Sequences(torch.from_numpy(vx), torch.from_numpy(vy), k),
                                    current_experience=k))
    info = ScenarioInfo(name=name, n_experiences=n_experiences, input_shape=(max_len,),
                        extra={"n_items": n_items, "max_len": max_len, "padding": 0, "holdout": holdout,
                               "windows": windows, "training_interactions": True})
    return Scenario(info, train, test, RankingEvaluator(n_items, k=10))
