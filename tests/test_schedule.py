"""Schedule specs in UTC: the grammar, descriptors, ``@every``, refusals, the value type."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from croniter import CroniterBadCronError
from croniter import croniter as croniter_class

from cronjob import Schedule, ScheduleError, _schedule, parse

#: Thursday 2026-01-01 00:00:00 UTC.
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def at(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=UTC)  # type: ignore[misc]


def upcoming(spec: str, after: datetime = NOW, count: int = 4) -> list[datetime]:
    schedule = parse(spec)
    found = []
    moment: datetime | None = after
    for _ in range(count):
        assert moment is not None
        moment = schedule.next(moment)
        if moment is None:
            break
        found.append(moment)
    return found


def exactly(message: str) -> str:
    return "^" + re.escape(message) + "$"


class TestFields:
    def test_a_star_in_every_field_fires_every_second(self):
        assert upcoming("* * * * * *", count=3) == [at(2026, 1, 1, 0, 0, s) for s in (1, 2, 3)]

    def test_a_single_second_fires_once_a_minute(self):
        assert upcoming("15 * * * * *", count=2) == [
            at(2026, 1, 1, 0, 0, 15),
            at(2026, 1, 1, 0, 1, 15),
        ]

    def test_a_list_fires_on_each_value(self):
        assert upcoming("0 5,10,50 * * * *") == [
            at(2026, 1, 1, 0, 5),
            at(2026, 1, 1, 0, 10),
            at(2026, 1, 1, 0, 50),
            at(2026, 1, 1, 1, 5),
        ]

    def test_a_range_includes_both_ends(self):
        assert upcoming("0 0 9-11 * * *") == [
            at(2026, 1, 1, 9),
            at(2026, 1, 1, 10),
            at(2026, 1, 1, 11),
            at(2026, 1, 2, 9),
        ]

    def test_a_star_step_counts_from_the_start_of_the_field(self):
        assert upcoming("0 */15 * * * *") == [
            at(2026, 1, 1, 0, 15),
            at(2026, 1, 1, 0, 30),
            at(2026, 1, 1, 0, 45),
            at(2026, 1, 1, 1, 0),
        ]

    def test_a_range_step_stays_inside_the_range(self):
        assert upcoming("0 5-40/5 * * * *", count=9)[-2:] == [
            at(2026, 1, 1, 0, 40),
            at(2026, 1, 1, 1, 5),
        ]

    def test_a_value_step_runs_to_the_end_of_the_field(self):
        assert upcoming("0 10/20 * * * *") == [
            at(2026, 1, 1, 0, 10),
            at(2026, 1, 1, 0, 30),
            at(2026, 1, 1, 0, 50),
            at(2026, 1, 1, 1, 10),
        ]

    def test_a_value_step_at_the_end_of_the_field_is_that_value(self):
        assert upcoming("0 59/15 * * * *", count=2) == [
            at(2026, 1, 1, 0, 59),
            at(2026, 1, 1, 1, 59),
        ]

    def test_a_step_longer_than_the_field_keeps_its_start(self):
        assert upcoming("0 */100 * * * *", count=2) == [at(2026, 1, 1, 1), at(2026, 1, 1, 2)]

    def test_an_equal_range_is_that_one_value(self):
        """croniter widens "5-5" to the whole field; robfig/cron reads minute 5."""
        assert upcoming("0 5-5 * * * *", count=2) == [at(2026, 1, 1, 0, 5), at(2026, 1, 1, 1, 5)]

    def test_an_equal_range_with_a_step_is_that_one_value(self):
        """Passed on as "5/10", croniter would read a step from 5 to the end of the field."""
        assert upcoming("0 5-5/10 * * * *", count=2) == [at(2026, 1, 1, 0, 5), at(2026, 1, 1, 1, 5)]

    def test_a_star_may_be_one_element_of_a_list(self):
        assert upcoming("0 */20,5 * * * *") == [
            at(2026, 1, 1, 0, 5),
            at(2026, 1, 1, 0, 20),
            at(2026, 1, 1, 0, 40),
            at(2026, 1, 1, 1, 0),
        ]

    def test_leading_zeros_are_plain_numbers(self):
        assert upcoming("00 05 09 * * *", count=1) == [at(2026, 1, 1, 9, 5)]

    def test_fields_may_be_separated_by_any_whitespace(self):
        assert parse("0  0\t9 * *\n*").next(NOW) == at(2026, 1, 1, 9)

    def test_the_31st_skips_the_months_without_one(self):
        assert upcoming("0 0 0 31 * *", count=3) == [
            at(2026, 1, 31),
            at(2026, 3, 31),
            at(2026, 5, 31),
        ]

    def test_a_step_on_day_of_month_counts_from_the_first(self):
        assert upcoming("0 0 0 */10 * *") == [
            at(2026, 1, 11),
            at(2026, 1, 21),
            at(2026, 1, 31),
            at(2026, 2, 1),
        ]

    def test_a_step_on_month_counts_from_january(self):
        assert upcoming("0 0 0 1 */4 *", count=3) == [
            at(2026, 5, 1),
            at(2026, 9, 1),
            at(2027, 1, 1),
        ]

    def test_the_year_rolls_over(self):
        assert parse("0 0 0 1 1 *").next(at(2026, 12, 31, 23, 59, 59)) == at(2027, 1, 1)


class TestNames:
    def test_month_names_are_case_insensitive(self):
        assert upcoming("0 0 0 1 jul,Jan *", count=2) == [at(2026, 7, 1), at(2027, 1, 1)]

    def test_month_name_ranges(self):
        assert upcoming("0 0 0 1 NOV-DEC *", count=3) == [
            at(2026, 11, 1),
            at(2026, 12, 1),
            at(2027, 11, 1),
        ]

    def test_weekday_names_are_case_insensitive(self):
        # 2026-01-01 is a Thursday.
        assert upcoming("0 0 9 * * MON-fri") == [
            at(2026, 1, 1, 9),
            at(2026, 1, 2, 9),
            at(2026, 1, 5, 9),
            at(2026, 1, 6, 9),
        ]

    @pytest.mark.parametrize("sunday", ["0", "7", "SUN", "sun", "7-7"])
    def test_every_spelling_of_sunday_is_sunday(self, sunday):
        assert upcoming(f"0 0 0 * * {sunday}", count=2) == [at(2026, 1, 4), at(2026, 1, 11)]

    def test_a_weekday_range_may_end_on_seven(self):
        assert upcoming("0 0 0 * * 5-7", count=4) == [
            at(2026, 1, 2),
            at(2026, 1, 3),
            at(2026, 1, 4),
            at(2026, 1, 9),
        ]

    def test_a_weekday_value_step_ends_on_saturday(self):
        # Wednesday and Friday: "3/2" does not reach 7 (Sunday).
        assert upcoming("0 0 0 * * 3/2", count=3) == [
            at(2026, 1, 2),
            at(2026, 1, 7),
            at(2026, 1, 9),
        ]


class TestDayFields:
    def test_both_restricted_fire_when_either_matches(self):
        # Fridays (2, 9, 16) and the 13th (a Tuesday).
        assert upcoming("0 0 0 13 * FRI") == [
            at(2026, 1, 2),
            at(2026, 1, 9),
            at(2026, 1, 13),
            at(2026, 1, 16),
        ]

    def test_a_star_day_of_month_leaves_only_the_weekday(self):
        assert upcoming("0 0 0 * * FRI", count=2) == [at(2026, 1, 2), at(2026, 1, 9)]

    def test_a_star_weekday_leaves_only_the_day_of_month(self):
        assert upcoming("0 0 0 13 * *", count=2) == [at(2026, 1, 13), at(2026, 2, 13)]

    def test_a_stepped_star_is_restricted_so_either_day_field_matches(self):
        """robfig/cron's rule: "*/2" is restricted, so odd days OR Fridays (2026-01-02)."""
        assert upcoming("0 0 0 */2 * FRI", count=3) == [
            at(2026, 1, 2),
            at(2026, 1, 3),
            at(2026, 1, 5),
        ]

    def test_a_star_with_step_one_or_in_a_list_is_unrestricted(self):
        fridays = [at(2026, 1, 2), at(2026, 1, 9)]
        assert upcoming("0 0 0 */1 * FRI", count=2) == fridays
        assert upcoming("0 0 0 1,* * FRI", count=2) == fridays

    def test_a_question_mark_is_a_star_in_day_of_month(self):
        assert upcoming("0 0 0 ? * MON", count=2) == [at(2026, 1, 5), at(2026, 1, 12)]

    def test_a_question_mark_is_a_star_in_day_of_week(self):
        assert upcoming("0 0 0 13 * ?", count=2) == [at(2026, 1, 13), at(2026, 2, 13)]

    def test_leap_days_fire_only_in_leap_years(self):
        assert upcoming("0 0 0 29 2 *", count=2) == [at(2028, 2, 29), at(2032, 2, 29)]

    def test_2100_is_not_a_leap_year(self):
        assert upcoming("0 0 0 29 2 *", after=at(2097, 1, 1), count=1) == [at(2104, 2, 29)]

    def test_a_day_that_exists_only_on_some_weekdays_rule_still_fires(self):
        # 30 February never exists, but the OR rule adds every Monday of February.
        assert upcoming("0 0 0 30 2 MON", count=2) == [at(2026, 2, 2), at(2026, 2, 9)]


class TestDescriptors:
    @pytest.mark.parametrize(
        ("descriptor", "first", "second"),
        [
            ("@yearly", at(2027, 1, 1), at(2028, 1, 1)),
            ("@annually", at(2027, 1, 1), at(2028, 1, 1)),
            ("@monthly", at(2026, 2, 1), at(2026, 3, 1)),
            ("@weekly", at(2026, 1, 4), at(2026, 1, 11)),
            ("@daily", at(2026, 1, 2), at(2026, 1, 3)),
            ("@midnight", at(2026, 1, 2), at(2026, 1, 3)),
            ("@hourly", at(2026, 1, 1, 1), at(2026, 1, 1, 2)),
        ],
    )
    def test_each_descriptor_fires_at_its_instants(self, descriptor, first, second):
        assert upcoming(descriptor, count=2) == [first, second]

    @pytest.mark.parametrize(
        ("descriptor", "fields"),
        [
            ("@yearly", "0 0 0 1 1 *"),
            ("@annually", "0 0 0 1 1 *"),
            ("@monthly", "0 0 0 1 * *"),
            ("@weekly", "0 0 0 * * 0"),
            ("@daily", "0 0 0 * * *"),
            ("@midnight", "0 0 0 * * *"),
            ("@hourly", "0 0 * * * *"),
        ],
    )
    def test_each_descriptor_is_its_six_field_expression(self, descriptor, fields):
        start = at(2026, 1, 1, 7, 13, 5)
        assert upcoming(descriptor, after=start, count=5) == upcoming(fields, after=start, count=5)

    def test_descriptors_are_case_insensitive(self):
        assert parse("@Daily").next(NOW) == at(2026, 1, 2)

    def test_a_zoned_descriptor_reads_the_zone(self):
        schedule = parse("CRON_TZ=Asia/Tokyo @daily")
        assert schedule.zone == ZoneInfo("Asia/Tokyo")
        assert schedule.next(NOW) == at(2026, 1, 1, 15)  # midnight in Tokyo, UTC+9

    def test_calendar_descriptors_but_hourly_are_fixed_time(self):
        assert parse("CRON_TZ=Europe/London @daily").fixed_time
        assert parse("@weekly").fixed_time
        assert not parse("@hourly").fixed_time


class TestEvery:
    @pytest.mark.parametrize(
        ("duration", "seconds"),
        [
            ("1s", 1),
            ("7s", 7),
            ("90s", 90),
            ("5m", 300),
            ("1h30m", 5400),
            ("1h0m0s", 3600),
            ("1m30s", 90),
            ("1.5h", 5400),
            ("1.25m", 75),
            ("0.5m", 30),
            (".5m", 30),
            ("1.m", 60),
            ("+5m", 300),
            ("2000ms", 2),
            ("3000000us", 3),
            ("3000000\u00b5s", 3),
            ("3000000\u03bcs", 3),
            ("1000000000ns", 1),
            ("1h1h", 7200),
            ("2562047h", 2562047 * 3600),
        ],
    )
    def test_it_reads_go_durations(self, duration, seconds):
        schedule = parse(f"@every {duration}")
        assert schedule.is_every
        assert schedule.period == seconds

    @pytest.mark.parametrize(
        ("spec", "after", "expected"),
        [
            # 2026-01-01T00:00:00Z is 1767225600 s after the epoch, a multiple of 7.
            (
                "@every 7s",
                at(2026, 1, 1, 0, 0, 10),
                [at(2026, 1, 1, 0, 0, 14), at(2026, 1, 1, 0, 0, 21)],
            ),
            ("@every 90s", NOW, [at(2026, 1, 1, 0, 1, 30), at(2026, 1, 1, 0, 3)]),
            ("@every 1h30m", at(2026, 1, 1, 0, 0, 1), [at(2026, 1, 1, 1, 30), at(2026, 1, 1, 3)]),
            # 1 January 2026 is day 20454; 20454 % 11 == 5, so day 20460 (7 Jan) is next.
            ("@every 264h", NOW, [at(2026, 1, 7), at(2026, 1, 18)]),
        ],
    )
    def test_instants_are_multiples_of_the_period_since_the_epoch(self, spec, after, expected):
        assert upcoming(spec, after=after, count=2) == expected

    def test_the_epoch_itself_is_an_instant(self):
        schedule = parse("@every 7s")
        assert schedule.next(at(1969, 12, 31, 23, 59, 59)) == at(1970, 1, 1)
        assert schedule.prev(at(1970, 1, 1, 0, 0, 1)) == at(1970, 1, 1)
        assert schedule.prev(at(1970, 1, 1)) == at(1969, 12, 31, 23, 59, 53)

    def test_every_has_no_zone_and_is_not_fixed_time(self):
        schedule = parse("@every 5m")
        assert schedule.zone is None
        assert not schedule.fixed_time

    def test_cron_specs_have_no_period(self):
        schedule = parse("0 * * * * *")
        assert not schedule.is_every
        assert schedule.period is None


class TestInstants:
    def test_next_is_strictly_after(self):
        schedule = parse("0 0 * * * *")
        assert schedule.next(at(2026, 1, 1, 1)) == at(2026, 1, 1, 2)

    def test_prev_is_strictly_before(self):
        schedule = parse("0 0 * * * *")
        assert schedule.prev(at(2026, 1, 1, 1)) == at(2026, 1, 1, 0)

    def test_a_fraction_of_a_second_counts(self):
        schedule = parse("* * * * * *")
        half = NOW + timedelta(microseconds=500_000)
        assert schedule.next(half) == at(2026, 1, 1, 0, 0, 1)
        assert schedule.prev(half) == NOW
        assert parse("@every 1s").prev(half) == NOW

    def test_instants_are_utc_whole_seconds_whatever_the_zone_asked_in(self):
        tokyo = datetime(2026, 1, 1, 9, 0, 0, 250, tzinfo=ZoneInfo("Asia/Tokyo"))
        found = parse("0 * * * * *").next(tokyo)
        assert found == at(2026, 1, 1, 0, 1)
        assert found is not None and found.tzinfo is UTC and found.microsecond == 0

    def test_a_fixed_offset_tzinfo_is_accepted(self):
        plus_two = datetime(2026, 1, 1, 2, tzinfo=timezone(timedelta(hours=2)))
        assert parse("0 0 * * * *").next(plus_two) == at(2026, 1, 1, 1)

    def test_prev_finds_a_rare_instant_far_back(self):
        assert parse("0 0 0 29 2 *").prev(NOW) == at(2024, 2, 29)

    def test_prev_of_a_weekday_spec(self):
        assert parse("0 30 9 * * 1-5").prev(NOW) == at(2025, 12, 31, 9, 30)

    def test_next_returns_none_past_year_9999(self):
        assert parse("0 0 0 1 1 *").next(at(9999, 6, 1)) is None
        assert parse("* * * * * *").next(at(9999, 12, 31, 23, 59, 58)) == at(
            9999, 12, 31, 23, 59, 59
        )
        assert parse("* * * * * *").next(datetime.max.replace(tzinfo=UTC)) is None
        assert parse("@every 1h").next(datetime.max.replace(tzinfo=UTC)) is None

    def test_prev_returns_none_before_year_1(self):
        assert parse("0 0 0 2 1 *").prev(at(1, 1, 1, 12)) is None
        assert parse("* * * * * *").prev(datetime.min.replace(tzinfo=UTC)) is None
        assert parse("@every 1h").prev(datetime.min.replace(tzinfo=UTC)) is None
        assert parse("* * * * * *").prev(at(1, 1, 1, 0, 0, 1)) == at(1, 1, 1)

    def test_the_ends_of_the_range_work_in_a_zone(self):
        schedule = parse("CRON_TZ=Pacific/Kiritimati 0 0 * * * *")
        assert schedule.next(datetime.max.replace(tzinfo=UTC)) is None
        assert schedule.prev(datetime.min.replace(tzinfo=UTC)) is None
        assert schedule.next(at(9999, 12, 31, 20)) == at(9999, 12, 31, 21)

    @pytest.mark.parametrize("method", ["next", "prev", "on_transition"])
    def test_a_naive_datetime_is_refused(self, method):
        schedule = parse("0 * * * * *")
        argument = {"next": "after", "prev": "before", "on_transition": "instant"}[method]
        with pytest.raises(
            ValueError,
            match=exactly(
                f"{argument} must be an aware datetime, got the naive 2026-01-01T00:00:00; "
                "attach a zone, e.g. .replace(tzinfo=timezone.utc)"
            ),
        ):
            getattr(schedule, method)(datetime(2026, 1, 1))

    def test_a_non_datetime_is_refused(self):
        with pytest.raises(TypeError, match=exactly("after must be a datetime, not str")):
            parse("0 * * * * *").next("2026-01-01")  # type: ignore[arg-type]


class TestLastAnswerKept:
    """A schedule keeps its last answer to ``next`` and to ``prev`` (the jobs of one spec
    due at one instant ask it the same question): an answer never comes from another
    question's."""

    def test_next_and_prev_answer_each_question_as_a_fresh_schedule_does(self):
        kept = parse("7 */2 * * * *")
        t = datetime(2026, 12, 3, 16, 0, 7, tzinfo=UTC)
        questions = [
            t,
            t,  # asked again: the kept answer
            t + timedelta(microseconds=500_000),  # the same second: the same answer
            t - timedelta(seconds=1),
            t + timedelta(minutes=3),
            t,
            t.astimezone(ZoneInfo("Asia/Kolkata")),  # the same instant in another zone
        ]
        for when in questions:
            fresh = Schedule("7 */2 * * * *")
            assert kept.next(when) == fresh.next(when)
            assert kept.prev(when) == fresh.prev(when)
            assert kept.prev(when) < when < kept.next(when)  # type: ignore[operator]

    def test_prev_tells_a_whole_second_from_one_a_fraction_later(self):
        schedule = parse("7 * * * * *")
        t = datetime(2026, 12, 3, 16, 0, 7, tzinfo=UTC)
        assert schedule.prev(t) == t - timedelta(minutes=1)
        assert schedule.prev(t + timedelta(microseconds=1)) == t
        assert schedule.prev(t) == t - timedelta(minutes=1)


class TestValue:
    def test_the_attributes_describe_the_spec(self):
        schedule = parse("CRON_TZ=Europe/Berlin 0 30 9 * * 1-5")
        assert schedule.spec == "CRON_TZ=Europe/Berlin 0 30 9 * * 1-5"
        assert schedule.zone == ZoneInfo("Europe/Berlin")
        assert not schedule.is_every
        assert schedule.period is None
        assert schedule.fixed_time

    def test_a_spec_parsed_again_is_the_same_schedule_and_a_refusal_is_never_kept(self):
        """Specs' parts are kept (an application registers thousands of jobs on a few
        specs): the schedules are equal and their instants the same; a spec refused
        raises each time, and a ``str`` subclass is read as its text."""

        class Spec(str):
            def __hash__(self) -> int:
                return 0

            def __eq__(self, other: object) -> bool:
                return True

        first, again = parse("0 30 9 * * 1-5"), parse("0 30 9 * * 1-5")
        assert first == again and first.next(NOW) == again.next(NOW)
        assert parse(Spec("0 0 * * * *")).next(NOW) == at(2026, 1, 1, 1)
        assert parse(Spec("0 30 9 * * 1-5")).next(NOW) == first.next(NOW)
        for _ in range(2):
            with pytest.raises(ScheduleError, match="minute"):
                parse("0 61 * * * *")

    def test_jobs_on_one_spec_share_one_schedule_but_a_str_subclass_gets_its_own(self):
        """A schedule is immutable: the jobs of a spec share one (a replica of 100,000
        jobs on a few specs kept 100,000 equal ones); a ``str`` subclass is not a key."""

        class Spec(str):
            pass

        first = parse("0 15 * * * *")
        assert parse("0 15 * * * *") is first
        own = parse(Spec("0 15 * * * *"))
        assert own is not first and own == first and type(own.spec) is Spec

    def test_a_spec_without_prefix_is_utc(self):
        assert parse("0 30 9 * * 1-5").zone is None

    def test_tz_is_a_synonym_of_cron_tz(self):
        assert parse("TZ=Europe/Berlin 0 30 9 * * *").next(NOW) == at(2026, 1, 1, 8, 30)

    @pytest.mark.parametrize(
        ("spec", "fixed"),
        [
            ("0 30 9 * * *", True),
            ("0 0-30 9 * * *", True),
            ("0 0,30 1-3 * * *", True),
            ("0 */15 * * * *", False),
            ("0 0 * * * *", False),
            ("* 0 0 * * *", False),
            ("0 30 */2 * * *", False),
        ],
    )
    def test_fixed_time_means_no_time_field_starts_with_a_star(self, spec, fixed):
        assert parse(spec).fixed_time is fixed

    def test_the_repr_shows_the_spec(self):
        assert repr(parse("0 30 9 * * 1-5")) == "Schedule('0 30 9 * * 1-5')"

    def test_schedules_are_equal_by_spec_text(self):
        assert parse("0 * * * * *") == parse("0 * * * * *")
        assert hash(parse("@daily")) == hash(parse("@daily"))
        assert parse("@daily") != parse("0 0 0 * * *")
        assert parse("@daily") != "@daily"

    def test_schedule_of_a_spec_is_parse(self):
        assert Schedule("@hourly") == parse("@hourly")

    def test_it_is_immutable(self):
        schedule = parse("@hourly")
        with pytest.raises(dataclasses.FrozenInstanceError):
            schedule.spec = "@daily"  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            schedule.period = 5  # type: ignore[misc]
        with pytest.raises((AttributeError, TypeError)):
            schedule.anything = 1  # type: ignore[attr-defined]

    def test_it_pickles_and_copies(self):
        schedule = parse("CRON_TZ=Europe/Berlin 0 30 9 * * 1-5")
        for clone in (pickle.loads(pickle.dumps(schedule)), copy.deepcopy(schedule)):
            assert clone == schedule
            assert clone.next(NOW) == schedule.next(NOW)


class TestRefusals:
    @pytest.mark.parametrize(
        ("spec", "message"),
        [
            (
                "",
                "empty schedule spec: give six cron fields, seconds first (e.g. '0 */5 * * * *'), "
                "or a descriptor such as '@hourly'",
            ),
            (
                "  \t ",
                "empty schedule spec: give six cron fields, seconds first (e.g. '0 */5 * * * *'), "
                "or a descriptor such as '@hourly'",
            ),
            (
                "*/5 * * * *",
                "'*/5 * * * *' has 5 fields, but cron specs here have six, seconds first: "
                "write '0 */5 * * * *' to fire at second 0",
            ),
            (
                "CRON_TZ=Europe/Berlin 30 9 * * 1-5",
                "'CRON_TZ=Europe/Berlin 30 9 * * 1-5' has 5 fields, but cron specs here have six, "
                "seconds first: write 'CRON_TZ=Europe/Berlin 0 30 9 * * 1-5' to fire at second 0",
            ),
            (
                "0 0 0 * * * 2026",
                "'0 0 0 * * * 2026' has 7 fields; a cron spec has six, seconds first: "
                "second minute hour day-of-month month day-of-week",
            ),
            (
                "0",
                "'0' has 1 field; a cron spec has six, seconds first: "
                "second minute hour day-of-month month day-of-week",
            ),
            (
                "@often",
                "unknown descriptor '@often' in '@often': use @yearly, @annually, @monthly, "
                "@weekly, @daily, @midnight, @hourly or '@every <duration>'",
            ),
            ("@daily 5", "descriptor '@daily' in '@daily 5' takes no arguments"),
        ],
    )
    def test_it_refuses_malformed_specs(self, spec, message):
        with pytest.raises(ScheduleError, match=exactly(message)):
            parse(spec)

    @pytest.mark.parametrize(
        ("spec", "message"),
        [
            (
                "60 * * * * *",
                "second value 60 in '60 * * * * *' is out of range: second must be 0-59",
            ),
            (
                "0 60 * * * *",
                "minute value 60 in '0 60 * * * *' is out of range: minute must be 0-59",
            ),
            ("0 0 24 * * *", "hour value 24 in '0 0 24 * * *' is out of range: hour must be 0-23"),
            (
                "0 0 0 0 * *",
                "day-of-month value 0 in '0 0 0 0 * *' is out of range: day-of-month must be 1-31",
            ),
            (
                "0 0 0 32 * *",
                "day-of-month value 32 in '0 0 0 32 * *' is out of range: "
                "day-of-month must be 1-31",
            ),
            (
                "0 0 0 * 13 *",
                "month value 13 in '0 0 0 * 13 *' is out of range: month must be 1-12 or JAN-DEC",
            ),
            (
                "0 0 0 * * 8",
                "day-of-week value 8 in '0 0 0 * * 8' is out of range: "
                "day-of-week must be 0-7 (0 and 7 are Sunday) or SUN-SAT",
            ),
            (
                "0 0-99999999999 * * * *",
                "minute value 99999999999 in '0 0-99999999999 * * * *' is out of range: "
                "minute must be 0-59",
            ),
        ],
    )
    def test_it_refuses_out_of_range_values(self, spec, message):
        with pytest.raises(ScheduleError, match=exactly(message)):
            parse(spec)

    def test_it_refuses_a_zero_step(self):
        with pytest.raises(
            ScheduleError,
            match=exactly("step 0 in '*/0' (minute field of '0 */0 * * * *') must be at least 1"),
        ):
            parse("0 */0 * * * *")

    @pytest.mark.parametrize(
        ("spec", "message"),
        [
            (
                "0 0 22-2 * * *",
                "range '22-2' in the hour field of '0 0 22-2 * * *' runs backwards: "
                "write it as '22-23,0-2'",
            ),
            (
                "0 0 0 * * FRI-MON",
                "range 'FRI-MON' in the day-of-week field of '0 0 0 * * FRI-MON' runs backwards: "
                "write it as '5-6,0-1'",
            ),
        ],
    )
    def test_it_refuses_a_backwards_range(self, spec, message):
        """croniter wraps such ranges around; robfig/cron refuses them, and so do we."""
        with pytest.raises(ScheduleError, match=exactly(message)):
            parse(spec)

    def test_it_refuses_a_question_mark_outside_the_day_fields(self):
        with pytest.raises(
            ScheduleError,
            match=exactly(
                "'?' in the minute field of '0 ? * * * *' is only allowed in the day-of-month "
                "and day-of-week fields; use '*'"
            ),
        ):
            parse("0 ? * * * *")

    @pytest.mark.parametrize(
        ("spec", "token", "field", "what"),
        [
            ("0 0 0 L * *", "L", "day-of-month", "'L' (last day)"),
            ("0 0 0 * * 5L", "5L", "day-of-week", "'L' (last day)"),
            ("0 0 0 15W * *", "15W", "day-of-month", "'W' (nearest weekday)"),
            ("0 0 0 LW * *", "LW", "day-of-month", "'W' (nearest weekday)"),
            ("0 0 0 * * 1#2", "1#2", "day-of-week", "'#' (nth weekday of the month)"),
            ("H 0 0 * * *", "H", "second", "'H' (hashed value)"),
            ("0 H/5 0 * * *", "H/5", "minute", "'H' (hashed value)"),
            ("0 0 0 R * *", "R", "day-of-month", "'R' (random value)"),
        ],
    )
    def test_it_refuses_croniter_extensions(self, spec, token, field, what):
        with pytest.raises(
            ScheduleError,
            match=exactly(
                f"{token!r} in the {field} field of {spec!r} uses {what}, a croniter extension "
                "that robfig/cron, and so cronjob, does not support; write the values out instead"
            ),
        ):
            parse(spec)

    @pytest.mark.parametrize(
        ("spec", "token", "field", "allowed"),
        [
            ("0 0 0 * JANUARY *", "JANUARY", "month", "1-12 or JAN-DEC"),
            ("0 0 0 * * monday", "monday", "day-of-week", "0-7 (0 and 7 are Sunday) or SUN-SAT"),
            ("0 0 MON * * *", "MON", "hour", "0-23"),
            ("0 1,,2 * * * *", "", "minute", "0-59"),
            ("0 1-2-3 * * * *", "1-2-3", "minute", "0-59"),
            ("0 -5 * * * *", "-5", "minute", "0-59"),
            ("0 */x * * * *", "*/x", "minute", "0-59"),
            ("0 *-5 * * * *", "*-5", "minute", "0-59"),
            ("0 0 0 ?/2 * *", "?/2", "day-of-month", "1-31"),
            ("0 \u0663 * * * *", "\u0663", "minute", "0-59"),
        ],
    )
    def test_it_refuses_malformed_elements(self, spec, token, field, allowed):
        with pytest.raises(
            ScheduleError,
            match=exactly(
                f"{token!r} in the {field} field of {spec!r} is not valid: use *, a value "
                f"({allowed}), a range (a-b), a step (*/n, a/n or a-b/n), or a list of those"
            ),
        ):
            parse(spec)

    @pytest.mark.parametrize("spec", ["CRON_TZ=Local 0 0 9 * * *", "TZ=Local @daily"])
    def test_it_refuses_the_local_zone(self, spec):
        with pytest.raises(
            ScheduleError,
            match=exactly(
                f"zone 'Local' in {spec!r} is refused: the replicas of a deployment need not "
                "share a local zone; name an IANA zone such as 'Europe/Berlin'"
            ),
        ):
            parse(spec)

    @pytest.mark.parametrize(
        "zone", ["Mars/Olympus", "America", "/etc/localtime", "../UTC", "x\x00"]
    )
    def test_it_refuses_an_unknown_zone(self, zone):
        spec = f"CRON_TZ={zone} 0 0 9 * * *"
        with pytest.raises(
            ScheduleError,
            match=exactly(
                f"unknown time zone {zone!r} in {spec!r}: name an IANA zone such as 'Europe/Berlin'"
            ),
        ):
            parse(spec)

    def test_it_refuses_an_empty_zone(self):
        with pytest.raises(
            ScheduleError,
            match=exactly(
                "'CRON_TZ= 0 0 9 * * *' has an empty CRON_TZ= prefix: name an IANA zone, "
                "e.g. 'CRON_TZ=Europe/Berlin'"
            ),
        ):
            parse("CRON_TZ= 0 0 9 * * *")

    def test_it_refuses_a_zone_without_a_schedule(self):
        with pytest.raises(
            ScheduleError,
            match=exactly(
                "'CRON_TZ=Europe/Berlin' names a zone but no schedule: write the six cron fields "
                "or a descriptor after 'CRON_TZ=Europe/Berlin'"
            ),
        ):
            parse("CRON_TZ=Europe/Berlin")

    @pytest.mark.parametrize("spec", ["CRON_TZ=Europe/Berlin @every 5m", "TZ=UTC @every 1h"])
    def test_it_refuses_a_zone_on_every(self, spec):
        prefix = spec.split()[0]
        with pytest.raises(
            ScheduleError,
            match=exactly(
                f"{spec!r} puts a zone on '@every', which follows no wall clock: its instants "
                f"are multiples of the period since the Unix epoch; remove {prefix!r}"
            ),
        ):
            parse(spec)

    @pytest.mark.parametrize(
        ("spec", "message"),
        [
            (
                "@every 1500ms",
                "'@every 1500ms' has a period of 1.5s: it must be a whole number of seconds",
            ),
            (
                "@every 500ms",
                "'@every 500ms' has a period of 0.5s, shorter than the 1s resolution of instants: "
                "it must be a whole number of seconds, at least 1s",
            ),
            ("@every 0s", "'@every 0s' has a zero period: it must be at least 1s"),
            ("@every 0", "'@every 0' has a zero period: it must be at least 1s"),
            ("@every -5m", "'@every -5m' has a negative period: it must be at least 1s"),
            (
                "@every 5",
                "'5' in '@every 5' is not a duration (missing unit): "
                "write a Go duration such as '90s', '5m' or '1h30m'",
            ),
            (
                "@every 5d",
                "'5d' in '@every 5d' is not a duration "
                "(unknown unit 'd'; use ns, us, ms, s, m or h): "
                "write a Go duration such as '90s', '5m' or '1h30m'",
            ),
            (
                "@every .s",
                "'.s' in '@every .s' is not a duration (no number before the unit): "
                "write a Go duration such as '90s', '5m' or '1h30m'",
            ),
            (
                "@every -",
                "'-' in '@every -' is not a duration (no number): "
                "write a Go duration such as '90s', '5m' or '1h30m'",
            ),
            (
                "@every 3000000h",
                "'3000000h' in '@every 3000000h' is not a duration (longer than Go's maximum "
                "duration, about 292 years): write a Go duration such as '90s', '5m' or '1h30m'",
            ),
            ("@every", "'@every' needs exactly one duration after '@every', e.g. '@every 5m'"),
            (
                "@every 1m 2m",
                "'@every 1m 2m' needs exactly one duration after '@every', e.g. '@every 5m'",
            ),
        ],
    )
    def test_it_refuses_an_every_that_is_not_whole_positive_seconds(self, spec, message):
        with pytest.raises(ScheduleError, match=exactly(message)):
            parse(spec)

    @pytest.mark.parametrize(
        ("spec", "message"),
        [
            (
                "0 0 0 30 2 *",
                "'0 0 0 30 2 *' never fires: day-of-month 30 never occurs in February",
            ),
            (
                "0 0 0 31 4,6,9,11 *",
                "'0 0 0 31 4,6,9,11 *' never fires: day-of-month 31 never occurs in "
                "April, June, September or November",
            ),
            (
                "CRON_TZ=Europe/Berlin 0 0 0 30,31 FEB ?",
                "'CRON_TZ=Europe/Berlin 0 0 0 30,31 FEB ?' never fires: day-of-month 30,31 never "
                "occurs in February",
            ),
            (
                "0 0 0 30 2 */1",
                "'0 0 0 30 2 */1' never fires: day-of-month 30 never occurs in February",
            ),
        ],
    )
    def test_it_refuses_a_schedule_that_never_fires_at_once(self, spec, message):
        started = time.thread_time()  # CPU time: a busy machine must not fail this
        with pytest.raises(ScheduleError, match=exactly(message)):
            parse(spec)
        assert time.thread_time() - started < 0.1

    def test_it_refuses_a_spec_that_is_not_a_string(self):
        with pytest.raises(TypeError, match=exactly("spec must be a str, not bytes")):
            parse(b"@daily")  # type: ignore[arg-type]

    def test_schedule_errors_are_value_errors(self):
        with pytest.raises(ValueError, match="never fires"):
            parse("0 0 0 30 2 *")


class TestCroniterBoundary:
    @pytest.fixture(autouse=True)
    def parsed_afresh(self) -> Iterator[None]:
        """These tests make croniter fail: no spec's parts kept from before may hide it,
        and none parsed against a failing croniter may outlive them."""
        _schedule._kept_parts.cache_clear()
        _schedule._kept_schedule.cache_clear()
        yield
        _schedule._kept_parts.cache_clear()
        _schedule._kept_schedule.cache_clear()

    def test_a_croniter_error_becomes_a_schedule_error(self, monkeypatch):
        """The screen leaves croniter nothing to refuse; if it ever does, nothing leaks."""

        def refuse(cls, expression, /, **options):
            raise CroniterBadCronError("not acceptable")

        monkeypatch.setattr(croniter_class, "expand", classmethod(refuse))
        with pytest.raises(
            ScheduleError,
            match=exactly("'0 0 9 * * *' is not a valid cron spec: not acceptable"),
        ) as caught:
            parse("0 0 9 * * *")
        assert isinstance(caught.value.__cause__, CroniterBadCronError)

    def test_an_unforeseen_croniter_exception_is_translated_too(self, monkeypatch):
        def explode(cls, expression, /, **options):
            raise KeyError("surprise")

        monkeypatch.setattr(croniter_class, "expand", classmethod(explode))
        with pytest.raises(
            ScheduleError, match=exactly("'@daily' is not a valid cron spec: 'surprise'")
        ):
            parse("@daily")

    @pytest.mark.parametrize(
        "spec",
        [
            "0 0 0 L * *",
            "0 0 0 * * 1#2",
            "0 0 0 15W * *",
            "H 0 0 * * *",
            "0 0 0 * * * 2020",
            "0 0 0 * january *",
            "0 0 * * * 5L",
            "0 0 0 * * 08",
            "0 0 0 R * *",
        ],
    )
    def test_specs_croniter_treats_specially_raise_only_schedule_errors(self, spec):
        with pytest.raises(ScheduleError) as caught:
            parse(spec)
        assert type(caught.value) is ScheduleError
