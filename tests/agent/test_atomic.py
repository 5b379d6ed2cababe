"""agent/atomic.py: a file written whole or not at all."""

from __future__ import annotations

import errno

import pytest

from agent.atomic import replace_directory, write_atomic


def test_a_write_replaces_the_file_whole(tmp_path) -> None:
    path = tmp_path / "f.json"
    path.write_text("old")
    write_atomic(path, lambda f: f.write(b"new"))
    assert path.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


@pytest.mark.parametrize(
    "stop", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()], ids=str
)
def test_a_write_that_stops_leaves_the_previous_file(tmp_path, stop) -> None:
    path = tmp_path / "f.json"
    path.write_text("old")

    def write(f) -> None:
        f.write(b"half")
        raise stop

    with pytest.raises(type(stop)) as err:
        write_atomic(path, write)
    if isinstance(stop, OSError):  # named, errno kept
        assert err.value.errno == errno.ENOSPC and f"cannot write {path}" in str(err.value)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]


@pytest.mark.parametrize("earlier", [True, False], ids=["over-an-earlier-one", "new"])
def test_a_directory_is_put_in_place_whole(tmp_path, earlier: bool) -> None:
    target, new, aside = tmp_path / "out", tmp_path / "new", tmp_path / "out.old"
    new.mkdir()
    (new / "b").write_text("new")
    if earlier:
        target.mkdir()
        (target / "a").write_text("old")
    replace_directory(new, target, aside)
    assert [p.name for p in target.iterdir()] == ["b"]  # nothing of the earlier one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
