"""The scheduled instant in every hand-off's message: one form, RFC 3339 UTC with ``Z``.

Celery's header, Dramatiq's option and RQ's ``meta`` carry the same string (read here
from the messages each publisher builds, with no broker); `parse_instant` reads it and
the ``+00:00`` form of messages queued by earlier releases.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from cronjob.contrib import Occurrence, format_instant, parse_instant

INSTANT = datetime(2026, 3, 8, 2, 0, tzinfo=UTC)
WIRE = "2026-03-08T02:00:00Z"
OCCURRENCE = Occurrence(
    name="nightly-export",
    instant=INSTANT,
    id="0f8e4c1a-6c1b-5b5e-9f3e-2a1d6c7b8e90",
    headers={},
)


class TestTheForm:
    def test_it_is_utc_to_the_second_with_z(self):
        assert format_instant(INSTANT) == WIRE

    def test_another_zone_is_written_in_utc(self):
        paris = timezone(timedelta(hours=1))
        assert format_instant(datetime(2026, 3, 8, 3, 0, tzinfo=paris)) == WIRE

    def test_it_refuses_a_naive_instant(self):
        with pytest.raises(ValueError, match=r"^instant 2026-03-08T02:00:00 is naive; give"):
            format_instant(INSTANT.replace(tzinfo=None))

    def test_a_manual_rounds_fraction_of_a_second_is_kept_and_reads_back(self):
        asked = INSTANT.replace(microsecond=518000)
        assert format_instant(asked) == "2026-03-08T02:00:00.518000Z"
        assert parse_instant(format_instant(asked)) == asked


class TestReadingIt:
    @pytest.mark.parametrize(
        "text", [WIRE, "2026-03-08T02:00:00+00:00", "2026-03-08T03:00:00+01:00"]
    )
    def test_this_releases_form_and_the_earlier_one_read_the_same(self, text):
        parsed = parse_instant(text)
        assert parsed == INSTANT and parsed.tzinfo is UTC

    @pytest.mark.parametrize("text", ["2026-03-08T02:00:00", "tomorrow", ""])
    def test_it_refuses_what_is_not_an_aware_instant(self, text):
        with pytest.raises(ValueError):
            parse_instant(text)


class TestEveryTargetWritesIt:
    def test_celery_puts_it_in_the_cronjob_instant_header(self, monkeypatch):
        from celery import Celery

        from cronjob.contrib.celery import CeleryPublisher

        app = Celery("t", broker="memory://")
        sent: list[dict[str, object]] = []
        monkeypatch.setattr(app, "send_task", lambda name, **kw: sent.append(kw["headers"]))
        CeleryPublisher(app, "proj.export").publish(OCCURRENCE)
        assert [headers["cronjob_instant"] for headers in sent] == [WIRE]

    def test_dramatiq_puts_it_in_the_cronjob_instant_option(self):
        from dramatiq.brokers.stub import StubBroker

        from cronjob.contrib.dramatiq import INSTANT_OPTION, DramatiqPublisher

        message = DramatiqPublisher(StubBroker(), "export").message(OCCURRENCE)
        assert message.options[INSTANT_OPTION] == WIRE

    def test_rq_puts_it_in_the_jobs_meta(self, redis_url):
        import redis
        import rq

        from cronjob.contrib.rq import META_KEY, RQPublisher

        connection = redis.Redis.from_url(redis_url, socket_timeout=5)
        queue = rq.Queue(f"cronjob-test-{uuid.uuid4().hex[:12]}", connection=connection)
        occurrence = dataclasses.replace(OCCURRENCE, id=str(uuid.uuid4()))
        try:
            RQPublisher(queue, "proj.export").publish(occurrence)
            job = rq.job.Job.fetch(occurrence.id, connection=connection)
            assert job.meta[META_KEY]["instant"] == WIRE
        finally:
            queue.empty()
            connection.close()
