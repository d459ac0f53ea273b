"""Class orders: the published CIFAR-100 / ImageNet-100 orders, and the rule that resolves a scenario's choice.

``CIFAR100_ORDERS[k]`` is class order ``k`` (1, 2, 3) of DER and DyTox (order 1 is iCaRL's; the three orders are
listed together in PODNet's ``options/data/cifar100_3orders.yaml`` and one per file in DyTox's
``options/data/cifar100_order{1,2,3}.yaml``). ``IMAGENET100_ORDER1`` is DyTox's
``options/data/imagenet100_order1.yaml``: positions in the sorted list of the 100 ImageNet-100 wnids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from clbench.streams import seeded_class_order

CIFAR100_ORDERS: dict[int, tuple[int, ...]] = {
    1: (87, 0, 52, 58, 44, 91, 68, 97, 51, 15, 94, 92, 10, 72, 49, 78, 61, 14, 8, 86, 84, 96, 18, 24, 32, 45, 88, 11,
        4, 67, 69, 66, 77, 47, 79, 93, 29, 50, 57, 83, 17, 81, 41, 12, 37, 59, 25, 20, 80, 73, 1, 28, 6, 46, 62, 82,
        53, 9, 31, 75, 38, 63, 33, 74, 27, 22, 36, 3, 16, 21, 60, 19, 70, 90, 89, 43, 5, 42, 65, 76, 40, 30, 23, 85,
        2, 95, 56, 48, 71, 64, 98, 13, 99, 7, 34, 55, 54, 26, 35, 39),
    2: (58, 30, 93, 69, 21, 77, 3, 78, 12, 71, 65, 40, 16, 49, 89, 46, 24, 66, 19, 41, 5, 29, 15, 73, 11, 70, 90, 63,
        67, 25, 59, 72, 80, 94, 54, 33, 18, 96, 2, 10, 43, 9, 57, 81, 76, 50, 32, 6, 37, 7, 68, 91, 88, 95, 85, 4,
        60, 36, 22, 27, 39, 42, 34, 51, 55, 28, 53, 48, 38, 17, 83, 86, 56, 35, 45, 79, 99, 84, 97, 82, 98, 26, 47,
        44, 62, 13, 31, 0, 75, 14, 52, 74, 8, 20, 1, 92, 87, 23, 64, 61),
    3: (71, 54, 45, 32, 4, 8, 48, 66, 1, 91, 28, 82, 29, 22, 80, 27, 86, 23, 37, 47, 55, 9, 14, 68, 25, 96, 36, 90,
        58, 21, 57, 81, 12, 26, 16, 89, 79, 49, 31, 38, 46, 20, 92, 88, 40, 39, 98, 94, 19, 95, 72, 24, 64, 18, 60,
        50, 63, 61, 83, 76, 69, 35, 0, 52, 7, 65, 42, 73, 74, 30, 41, 3, 6, 53, 13, 56, 70, 77, 34, 97, 75, 2, 17,
        93, 33, 84, 99, 51, 62, 87, 5, 15, 10, 78, 67, 44, 59, 85, 43, 11),
}

IMAGENET100_ORDER1: tuple[int, ...] = (
    68, 56, 78, 8, 23, 84, 90, 65, 74, 76, 40, 89, 3, 92, 55, 9, 26, 80, 43, 38, 58, 70, 77, 1, 85, 19, 17, 50, 28, 53,
    13, 81, 45, 82, 6, 59, 83, 16, 15, 44, 91, 41, 72, 60, 79, 52, 20, 10, 31, 54, 37, 95, 14, 71, 96, 98, 97, 2, 64,
    66, 42, 22, 35, 86, 24, 34, 87, 21, 99, 0, 88, 27, 18, 94, 11, 12, 47, 25, 30, 46, 62, 69, 36, 61, 7, 63, 75, 5,
    32, 4, 51, 48, 73, 93, 39, 67, 29, 49, 57, 33)


def resolve_class_order(choice: int | str, n_classes: int, seed: int,
                        published: Mapping[int, Sequence[int]] | None = None) -> list[int]:
    """``"fixed"`` -> ``0..n-1``; ``"random"`` -> a permutation drawn from ``seed``; an int -> ``published[choice]``
    (a permutation of ``0..n-1``)."""
    named = {"fixed": lambda: list(range(n_classes)), "random": lambda: seeded_class_order(n_classes, seed)}
    named.update({k: (lambda order=order: list(order)) for k, order in (published or {}).items()})
    if choice not in named:
        raise ValueError(f"class_order must be one of {', '.join(map(repr, named))}; got {choice!r}.")
    order = named[choice]()
    if sorted(order) != list(range(n_classes)):
        raise ValueError(f"class order {choice!r} is not a permutation of the {n_classes} classes.")
    return order
