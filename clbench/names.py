"""Names that become parts of file names: a suite's name (``results/<suite>/``) and its entries' row keys (labels,
else registry names: ``runs/<scenario>__<strategy>__s<seed>.json``)."""

from __future__ import annotations

import re
from typing import Any

from clbench.errors import ConfigError
from clbench.typecheck import brief

MAX_NAME = 100      # a registry name, label or suite name: longer is not a name (and is cut in messages)


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def check_path_name(where: str, key: str, value: Any) -> str:
    """``value`` if it is a :data:`SAFE_NAME` without ``..`` (leaves its folder) or ``__`` (separates the parts of
    a run id); else :class:`ConfigError` naming ``where`` and ``key``."""
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value) or ".." in value or "__" in value:
        raise ConfigError(f"{where}: {key!r} {brief(value)} may contain only letters, digits, '_', '.', '+' and '-', "
                          f"start with a letter or digit and contain neither '..' nor '__': it becomes part of file "
                          f"names (results/<suite>/runs/<scenario>__<strategy>__s<seed>.json).")
    return value
