"""Folder scanning: recursive, sorted, hidden files passed over, links kept inside."""

from __future__ import annotations

import os
from pathlib import Path

from medrt.io.scan import iter_files


def test_scan_is_recursive_sorted_and_stays_inside(tmp_path: Path) -> None:
    root = tmp_path / "in"
    (root / "b").mkdir(parents=True)
    (root / "a").mkdir()
    (root / ".hidden").mkdir()
    for rel in ("b/2.dcm", "b/1.dcm", "a/x.dcm", "top.dcm", ".hidden/h.dcm", ".dotfile"):
        (root / rel).write_bytes(b"x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.dcm").write_bytes(b"x")
    os.symlink(outside, root / "link_out")
    os.symlink(root / "a", root / "link_in")
    os.symlink(root, root / "a" / "loop")

    found = [p.relative_to(root).as_posix() for p in iter_files([root])]
    # Sorted, top-down; hidden entries passed over; the link to a folder already
    # walked (link_in -> a) and the loop (a/loop -> in) are not walked twice;
    # link_out leads outside and is not followed.
    assert found == ["top.dcm", "a/x.dcm", "b/1.dcm", "b/2.dcm"]

    with_links = [p.relative_to(root).as_posix() for p in iter_files([root], follow_outside_links=True)]
    assert "link_out/secret.dcm" in with_links

    # what was not followed is told (medrt batch lists it in errors.csv; it was silent)
    passed_over: list[Path] = []
    list(iter_files([root], not_followed=passed_over))
    assert passed_over == [root / "link_out"]
    from medrt.batch.plan import scan

    notes = {n.file: n for n in scan(root).notes}
    assert notes["link_out"].kind == "skipped" and "--follow-links follows it" in notes["link_out"].reason


def test_scan_yields_missing_paths_for_the_reader_to_report(tmp_path: Path) -> None:
    assert list(iter_files([tmp_path / "absent.dcm"])) == [tmp_path / "absent.dcm"]
