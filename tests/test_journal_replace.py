"""Rewriting a journal whole (`Journal.replace`, on `replace_file`), in-process: the session store's compaction
keeps every live session and the store goes on working in the new file; a replacement that fails before its
rename leaves the old journal as it was."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from summaryd.server.storage.journal import Journal, batch_line, encode, read
from summaryd.server.storage.session_store import STORE_NAME, SessionRecord, SessionStore


@pytest.fixture
def state_fd(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def test_compacting_the_session_store_keeps_every_session(tmp_path: Path, state_fd: int) -> None:
    store = SessionStore(state_fd, retention_secs=86400)
    for last in range(1, 4):  # three lines per session before compaction
        store.record([SessionRecord("a", "run-a", last), SessionRecord("b", "run-b", 10 * last)])
    store.compact()
    assert len(read(STORE_NAME, state_fd).records) == 2  # one line per session
    store.record([SessionRecord("c", "run-c", 7)], sync=True)  # lands in the compacted file
    store.close()
    assert sorted(os.listdir(tmp_path)) == [STORE_NAME]

    reopened = SessionStore(state_fd, retention_secs=86400)
    try:
        assert [(r.run_dir, r.last) for r in map(reopened.get, "abc") if r] == [
            ("run-a", 3),
            ("run-b", 30),
            ("run-c", 7),
        ]
    finally:
        reopened.close()


def test_a_replacement_that_fails_before_the_rename_keeps_the_old_journal(tmp_path: Path, state_fd: int) -> None:
    old = Journal("j", state_fd, create=True)
    old.append({"e": 1}, {"e": 2})
    old.sync()

    def refuse() -> None:
        raise OSError("refused")

    with pytest.raises(OSError, match="refused"):
        Journal.replace("j", state_fd, [{"e": 2}], temporary="j.tmp", before_replace=refuse)
    old.append({"e": 3})  # the old journal is still the live one
    old.close()
    assert read("j", state_fd).records == [{"e": 1}, {"e": 2}, {"e": 3}]
    assert sorted(os.listdir(tmp_path)) == ["j"]

    new = Journal.replace("j", state_fd, [{"e": 3}], temporary="j.tmp")
    new.append({"e": 4})
    new.close()
    assert new.name == "j"
    assert read("j", state_fd).records == [{"e": 3}, {"e": 4}]


@pytest.mark.parametrize("session_id", ["", "s", "rank-7/é", 'quote " and \\ and \n and \x00', "日本語" * 50])
def test_a_batch_line_is_the_json_line_of_its_record(session_id: str, tmp_path: Path, state_fd: int) -> None:
    # A group commit's lines are made without json.dumps of the mapping: byte for byte the same, read back alike.
    for last, end in [(0, 0), (1, 4096), ((1 << 63) - 1, 1 << 40), (-1, 7)]:
        record = {"s": session_id, "q": last, "e": end}
        assert batch_line(session_id, last, end) == encode(record)
    journal = Journal("lines", state_fd, create=True)
    journal.append_lines(batch_line(session_id, 3, 100) + batch_line(session_id, 4, 200))
    journal.close()
    assert read("lines", state_fd).records == [{"s": session_id, "q": 3, "e": 100}, {"s": session_id, "q": 4, "e": 200}]
