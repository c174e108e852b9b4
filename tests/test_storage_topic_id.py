"""A partition directory records the topic id it belongs to (Kafka's partition.metadata).

Logs are found by directory name, and a topic deleted and re-created under the same name
has the same directory name. Without the id, a broker that was down during the delete
reuses the dead topic's records at overlapping offsets (issue 11, finding 3).
"""

from __future__ import annotations

import pytest
from helpers import log_records

from rillet.client.wire import records
from rillet.storage import LogManager, checkpoints
from rillet.storage.manager import DELETE_SUFFIX


def batch(n: int, tag: bytes = b"r") -> bytes:
    return records.encode_batch([tag + b"%04d" % i for i in range(n)])


def test_first_open_records_the_topic_id_durably(tmp_path):
    manager = LogManager(tmp_path)
    manager.startup()
    log = manager.get_or_create("t", 0, topic_id="id-A")
    assert checkpoints.read_topic_id(log.directory) == "id-A"
    assert (log.directory / checkpoints.PARTITION_METADATA).read_text() == (
        "version: 0\ntopic_id: id-A\n"
    )
    manager.close()


def test_a_log_of_a_deleted_topic_is_not_reused_for_its_successor(tmp_path):
    manager = LogManager(tmp_path)
    manager.startup()
    old = manager.get_or_create("t", 0, topic_id="id-A")
    old.append(batch(5, b"old"), 1)
    manager.close()
    # The broker was down while "t" was deleted and re-created with a new id.
    manager = LogManager(tmp_path)
    manager.startup()
    assert manager.get("t", 0).log_end_offset == 5  # opened by name at start-up
    new = manager.get_or_create("t", 0, topic_id="id-B")
    assert (new.log_start_offset, new.log_end_offset) == (0, 0)
    assert checkpoints.read_topic_id(new.directory) == "id-B"
    new.append(batch(3, b"new"), 4)
    assert [r.value for r in log_records(new)] == [b"new%04d" % i for i in range(3)]
    assert not list(tmp_path.glob(f"*{DELETE_SUFFIX}"))  # the old dir is gone
    manager.close()
    manager = LogManager(tmp_path)  # and it stays the new topic's after a restart
    manager.startup()
    again = manager.get_or_create("t", 0, topic_id="id-B")
    assert [r.value for r in log_records(again)] == [b"new%04d" % i for i in range(3)]
    manager.close()


def test_an_open_log_under_a_new_id_is_replaced(tmp_path):
    # The broker stayed up, but missed the delete (it only saw the successor's records).
    manager = LogManager(tmp_path)
    manager.startup()
    manager.get_or_create("t", 0, topic_id="id-A").append(batch(5), 1)
    new = manager.get_or_create("t", 0, topic_id="id-B")
    assert new.log_end_offset == 0
    assert manager.get("t", 0) is new
    manager.close()


def test_a_log_from_before_topic_ids_adopts_the_first_id(tmp_path):
    # Directories written before this file existed carry no id: keep their records.
    manager = LogManager(tmp_path)
    manager.startup()
    manager.get_or_create("t", 0).append(batch(5), 1)
    (tmp_path / "t-0" / checkpoints.PARTITION_METADATA).unlink(missing_ok=True)
    manager.close()
    manager = LogManager(tmp_path)
    manager.startup()
    log = manager.get_or_create("t", 0, topic_id="id-A")
    assert log.log_end_offset == 5
    assert checkpoints.read_topic_id(log.directory) == "id-A"
    manager.close()


@pytest.mark.parametrize("text", ["", "garbage", "version: 9\ntopic_id: x\n", "version: 0\n"])
def test_an_unreadable_partition_metadata_file_reads_as_missing(tmp_path, text):
    (tmp_path / checkpoints.PARTITION_METADATA).write_text(text)
    assert checkpoints.read_topic_id(tmp_path) is None
