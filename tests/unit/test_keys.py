"""Job ids are stored packed, and come back exactly as given."""

from __future__ import annotations

import uuid

import pytest

from celery_delayq.keys import new_job_id, pack_id, unpack_id
from celery_delayq.reading import job_id_of


def test_a_uuid4_job_id_is_stored_in_22_characters():
    for _ in range(1000):
        job_id = str(uuid.uuid4())
        stored = pack_id(job_id)
        assert len(stored) == 22 and stored.startswith("~")
        assert unpack_id(stored) == job_id


@pytest.mark.parametrize("job_id", [
    "order:42", "~starts-with-tilde", "~~", "~AAAAAAAAAAAAAAAAAAAAA",
    "42890294-e8b7-11f1-8f29-02fc00000001",  # a uuid1: not version 4
    "DB5B0B0A-E0E2-48AA-9DE8-B9A68E0B3601",  # a uuid4 upper-case: not canonical
    "0000000 -0000-4000-0000-000000000000", "0000_000-0000-4000-0000-000000000000",
    "00000000-0000-4000-0000-00000000000g",
])
def test_other_job_ids_come_back_unchanged(job_id):
    assert unpack_id(pack_id(job_id)) == job_id
    assert pack_id(job_id) in (job_id, "~" + job_id)


def test_new_job_id_is_a_version_4_uuid_with_its_packed_form():
    for _ in range(2000):
        job_id, stored = new_job_id()
        parsed = uuid.UUID(job_id)
        assert (str(parsed), parsed.version, parsed.variant) == (job_id, 4, uuid.RFC_4122)
        assert (stored, unpack_id(stored)) == (pack_id(job_id), job_id)


@pytest.mark.parametrize("stored", ["~", "~ab", "~" + "!" * 21, "~" + "A" * 22, "~é" + "A" * 20])
def test_a_damaged_id_that_only_looks_packed_comes_back_as_it_is(stored):
    assert unpack_id(stored) == stored
    assert job_id_of(stored) is None  # no id packs to it
