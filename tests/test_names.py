"""Names used in paths (:mod:`clbench.names`): the file-name limit of the output folder's file system, asked of the
nearest existing folder, and names refused against it."""

from __future__ import annotations

from pathlib import Path

import pytest

from clbench import typecheck
from clbench.errors import ConfigError


def test_name_limit_asks_the_nearest_existing_folder(tmp_path, monkeypatch):
    import os

    from clbench import names

    asked = []
    monkeypatch.setattr(os, "pathconf", lambda folder, name: asked.append((Path(folder), name)) or 77)
    assert names.name_limit(tmp_path / "not" / "yet") == 77 and asked == [(tmp_path, "PC_NAME_MAX")]

    def fails(folder, name):
        raise OSError("no")

    monkeypatch.setattr(os, "pathconf", fails)
    assert names.name_limit(tmp_path) == names.NAME_LIMIT


def test_file_names_longer_than_the_limit_with_their_suffixes_are_refused(tmp_path, monkeypatch):
    from clbench import names

    monkeypatch.setattr(names, "name_limit", lambda folder: 10 if folder == tmp_path else 0)
    names.check_file_names(tmp_path, ["a" * 7, "b" * 3], "run id", extra=3)
    names.check_file_names(tmp_path, ["a" * 10], "run id")
    with pytest.raises(ConfigError) as info:
        names.check_file_names(tmp_path, ["b" * 3, "é" * 4], "run id", extra=3)
    assert str(info.value) == (f"run id 'éééé' (8 bytes, 3 more in the names of its files) is too long for a file "
                               f"name in {tmp_path}, whose file system accepts at most 10 bytes; shorten the labels "
                               f"or seeds that make it.")


def test_a_path_name_of_max_name_characters_is_accepted_and_one_more_is_refused_with_the_exact_line():
    """``MAX_NAME`` (100) characters pass; 101 are refused naming where, the key, the value (brief), its length and
    the file-system limit."""
    from clbench import names

    assert names.check_path_name("s.yaml: suite", "label", "a" * 100) == "a" * 100
    with pytest.raises(ConfigError) as info:
        names.check_path_name("s.yaml: suite", "label", "a" * 101)
    assert str(info.value) == (f"s.yaml: suite: 'label' {typecheck.brief('a' * 101)} is 101 characters long; at most "
                               f"100: it becomes part of file names (<scenario>__<strategy>__s<seed>.json), which file "
                               f"systems limit to {names.NAME_LIMIT} bytes.")
