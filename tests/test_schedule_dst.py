"""Zoned schedules across daylight-saving transitions (SPEC.md, "DST").

A fixed-time spec (no time field starts with '*') fires a skipped local time once, at the
first instant after the gap, and a repeated local time once, on the first pass. A
wildcard spec follows real time: nothing in the gap, both passes of a repeated interval.

Every case names its transition; each is checked forwards with next(), backwards with
prev(), and with on_transition() marking exactly the instants the transition touches.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from cronjob import parse
from cronjob._schedule import DstMark

SKIPPED, FIRST, SECOND = DstMark.SKIPPED, DstMark.FIRST_PASS, DstMark.SECOND_PASS


def utc(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=UTC)  # type: ignore[misc]


@dataclass(frozen=True)
class Case:
    id: str
    spec: str
    after: datetime
    #: The instants that follow `after`, each with its DST mark (None: untouched).
    expected: tuple[tuple[datetime, DstMark | None], ...]


NEW_YORK = "CRON_TZ=America/New_York"
LONDON = "CRON_TZ=Europe/London"
LORD_HOWE = "CRON_TZ=Australia/Lord_Howe"

CASES = [
    # America/New_York, spring: Sunday 2026-03-08 at 02:00 EST (07:00Z) clocks jump to
    # 03:00 EDT; local 02:00:00-02:59:59 does not exist.
    Case(
        "new-york-spring-fixed",
        f"{NEW_YORK} 0 30 2 * * *",
        utc(2026, 3, 7),
        (
            (utc(2026, 3, 7, 7, 30), None),  # 02:30 EST
            (utc(2026, 3, 8, 7, 0), SKIPPED),  # 02:30 skipped -> 03:00 EDT
            (utc(2026, 3, 9, 6, 30), None),  # 02:30 EDT
        ),
    ),
    Case(
        "new-york-spring-fixed-times-in-the-gap-collapse",
        f"{NEW_YORK} 0 0,30 2,3 * * *",
        utc(2026, 3, 8, 6),
        (
            # 02:00 and 02:30 are skipped and 03:00 is the first instant after the gap:
            # three local times, one instant (07:00Z); then 03:30 EDT as usual.
            (utc(2026, 3, 8, 7, 0), SKIPPED),
            (utc(2026, 3, 8, 7, 30), None),
            (utc(2026, 3, 9, 6, 0), None),  # 02:00 EDT
        ),
    ),
    Case(
        "new-york-spring-wildcard",
        f"{NEW_YORK} 0 */30 * * * *",
        utc(2026, 3, 8, 6),  # 01:00 EST
        (
            (utc(2026, 3, 8, 6, 30), None),  # 01:30 EST
            (utc(2026, 3, 8, 7, 0), None),  # 03:00 EDT: nothing invented for 02:00, 02:30
            (utc(2026, 3, 8, 7, 30), None),  # 03:30 EDT
        ),
    ),
    # America/New_York, autumn: Sunday 2026-11-01 at 02:00 EDT (06:00Z) clocks go back to
    # 01:00 EST; local 01:00:00-01:59:59 happens twice, 05:00-05:59Z (EDT) then
    # 06:00-06:59Z (EST).
    Case(
        "new-york-autumn-fixed",
        f"{NEW_YORK} 0 30 1 * * *",
        utc(2026, 10, 31),
        (
            (utc(2026, 10, 31, 5, 30), None),  # 01:30 EDT
            (utc(2026, 11, 1, 5, 30), FIRST),  # 01:30 EDT, first pass only
            (utc(2026, 11, 2, 6, 30), None),  # 01:30 EST
        ),
    ),
    Case(
        "new-york-autumn-wildcard",
        f"{NEW_YORK} 0 30 * * * *",
        utc(2026, 11, 1, 4),
        (
            (utc(2026, 11, 1, 4, 30), None),  # 00:30 EDT
            (utc(2026, 11, 1, 5, 30), FIRST),  # 01:30 EDT
            (utc(2026, 11, 1, 6, 30), SECOND),  # 01:30 EST
            (utc(2026, 11, 1, 7, 30), None),  # 02:30 EST
        ),
    ),
    # Europe/London, spring: Sunday 2026-03-29 at 01:00 GMT (01:00Z) clocks jump to 02:00
    # BST; local 01:00:00-01:59:59 does not exist.
    Case(
        "london-spring-fixed",
        f"{LONDON} 0 30 1 * * *",
        utc(2026, 3, 28),
        (
            (utc(2026, 3, 28, 1, 30), None),  # 01:30 GMT
            (utc(2026, 3, 29, 1, 0), SKIPPED),  # 01:30 skipped -> 02:00 BST
            (utc(2026, 3, 30, 0, 30), None),  # 01:30 BST
        ),
    ),
    Case(
        "london-spring-wildcard",
        f"{LONDON} 0 */30 * * * *",
        utc(2026, 3, 29, 0, 15),
        (
            (utc(2026, 3, 29, 0, 30), None),  # 00:30 GMT
            (utc(2026, 3, 29, 1, 0), None),  # 02:00 BST; 01:00 and 01:30 never happen
            (utc(2026, 3, 29, 1, 30), None),  # 02:30 BST
        ),
    ),
    # Europe/London, autumn: Sunday 2026-10-25 at 02:00 BST (01:00Z) clocks go back to
    # 01:00 GMT; local 01:00:00-01:59:59 happens twice, 00:00-00:59Z then 01:00-01:59Z.
    Case(
        "london-autumn-fixed",
        f"{LONDON} 0 30 1 * * *",
        utc(2026, 10, 24),
        (
            (utc(2026, 10, 24, 0, 30), None),  # 01:30 BST
            (utc(2026, 10, 25, 0, 30), FIRST),  # 01:30 BST, first pass only
            (utc(2026, 10, 26, 1, 30), None),  # 01:30 GMT
        ),
    ),
    Case(
        "london-autumn-wildcard",
        f"{LONDON} 0 0 * * * *",
        utc(2026, 10, 24, 23, 30),
        (
            (utc(2026, 10, 25, 0, 0), FIRST),  # 01:00 BST
            (utc(2026, 10, 25, 1, 0), SECOND),  # 01:00 GMT
            (utc(2026, 10, 25, 2, 0), None),  # 02:00 GMT
        ),
    ),
    # Australia/Lord_Howe shifts by 30 minutes. Autumn: Sunday 2026-04-05 at 02:00 LHDT
    # (+11, 2026-04-04 15:00Z) clocks go back to 01:30 LHST (+10:30); local
    # 01:30:00-01:59:59 happens twice, 14:30-14:59Z then 15:00-15:29Z.
    Case(
        "lord-howe-autumn-fixed",
        f"{LORD_HOWE} 0 45 1 * * *",
        utc(2026, 4, 3),
        (
            (utc(2026, 4, 3, 14, 45), None),  # 04-04 01:45 +11
            (utc(2026, 4, 4, 14, 45), FIRST),  # 04-05 01:45 +11, first pass only
            (utc(2026, 4, 5, 15, 15), None),  # 04-06 01:45 +10:30
        ),
    ),
    Case(
        "lord-howe-autumn-wildcard",
        f"{LORD_HOWE} 0 */15 * * * *",
        utc(2026, 4, 4, 14, 20),
        (
            (utc(2026, 4, 4, 14, 30), FIRST),  # 01:30 +11
            (utc(2026, 4, 4, 14, 45), FIRST),  # 01:45 +11
            (utc(2026, 4, 4, 15, 0), SECOND),  # 01:30 +10:30
            (utc(2026, 4, 4, 15, 15), SECOND),  # 01:45 +10:30
            (utc(2026, 4, 4, 15, 30), None),  # 02:00 +10:30
        ),
    ),
    # Australia/Lord_Howe, spring: Sunday 2026-10-04 at 02:00 LHST (+10:30, 2026-10-03
    # 15:30Z) clocks jump to 02:30 LHDT (+11); local 02:00:00-02:29:59 does not exist.
    Case(
        "lord-howe-spring-fixed",
        f"{LORD_HOWE} 0 15 2 * * *",
        utc(2026, 10, 2),
        (
            (utc(2026, 10, 2, 15, 45), None),  # 10-03 02:15 +10:30
            (utc(2026, 10, 3, 15, 30), SKIPPED),  # 10-04 02:15 skipped -> 02:30 +11
            (utc(2026, 10, 4, 15, 15), None),  # 10-05 02:15 +11
        ),
    ),
    Case(
        "lord-howe-spring-wildcard",
        f"{LORD_HOWE} 0 */15 * * * *",
        utc(2026, 10, 3, 15),  # 01:30 +10:30
        (
            (utc(2026, 10, 3, 15, 15), None),  # 01:45 +10:30
            (utc(2026, 10, 3, 15, 30), None),  # 02:30 +11; 02:00 and 02:15 never happen
            (utc(2026, 10, 3, 15, 45), None),  # 02:45 +11
        ),
    ),
    # Pacific/Apia skipped a whole day: 2011-12-29 23:59:59 -10 was followed by
    # 2011-12-31 00:00:00 +14 (at 2011-12-30 10:00Z).
    Case(
        "apia-skipped-day-fixed",
        "CRON_TZ=Pacific/Apia 0 0 9 * * *",
        utc(2011, 12, 29),
        (
            (utc(2011, 12, 29, 19), None),  # 12-29 09:00 -10
            (utc(2011, 12, 30, 10), SKIPPED),  # 12-30 09:00 skipped -> 12-31 00:00 +14
            (utc(2011, 12, 30, 19), None),  # 12-31 09:00 +14
        ),
    ),
    # America/New_York adopted standard time on 1883-11-18 at 12:03:58 local mean time
    # (-4:56:02, 17:00Z), setting clocks back to 12:00:00 EST: 12:00:00-12:03:57 twice.
    Case(
        "new-york-1883-odd-offset-fixed",
        f"{NEW_YORK} 0 2 12 * * *",
        utc(1883, 11, 18),
        (
            (utc(1883, 11, 18, 16, 58, 2), FIRST),  # 12:02 LMT, first pass only
            (utc(1883, 11, 19, 17, 2), None),  # 12:02 EST
        ),
    ),
    Case(
        "new-york-1883-odd-offset-wildcard",
        f"{NEW_YORK} 0 * 12 * * *",
        utc(1883, 11, 18, 16, 57),
        (
            (utc(1883, 11, 18, 16, 57, 2), FIRST),  # 12:01 LMT
            (utc(1883, 11, 18, 16, 58, 2), FIRST),  # 12:02 LMT
            (utc(1883, 11, 18, 16, 59, 2), FIRST),  # 12:03 LMT
            (utc(1883, 11, 18, 17, 0), SECOND),  # 12:00 EST
            (utc(1883, 11, 18, 17, 1), SECOND),  # 12:01 EST
        ),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
class TestTransitions:
    def test_next_steps_through_the_transition(self, case):
        schedule = parse(case.spec)
        found = []
        moment = case.after
        for _ in case.expected:
            moment = schedule.next(moment)
            found.append(moment)
        assert found == [instant for instant, _ in case.expected]

    def test_prev_steps_back_through_the_transition(self, case):
        schedule = parse(case.spec)
        instants = [instant for instant, _ in case.expected]
        assert [schedule.prev(later) for later in instants[1:]] == instants[:-1]

    def test_on_transition_marks_the_instants_it_touches(self, case):
        schedule = parse(case.spec)
        for instant, mark in case.expected:
            assert schedule._dst_mark(instant) is mark, instant
            assert schedule.on_transition(instant) is (mark is not None)


class TestRule:
    def test_a_fixed_time_spec_runs_once_on_every_calendar_day(self):
        """02:30 every day in New York: 365 runs in 2026, one per local date."""
        schedule = parse(f"{NEW_YORK} 0 30 2 * * *")
        zone = schedule.zone
        moment = utc(2026, 1, 1, 5)  # 2026-01-01 00:00 EST
        dates = []
        while True:
            moment = schedule.next(moment)
            if moment >= utc(2027, 1, 1, 5):
                break
            dates.append(moment.astimezone(zone).date())
        assert len(dates) == len(set(dates)) == 365

    def test_a_wildcard_spec_runs_once_per_real_hour(self):
        """Hourly in London in 2026: 8760 hours, so 8760 runs, DST or not."""
        schedule = parse(f"{LONDON} 0 0 * * * *")
        moment = utc(2025, 12, 31, 23)
        count = 0
        while (moment := schedule.next(moment)) < utc(2027, 1, 1):
            count += 1
        assert count == 8760

    def test_a_utc_schedule_is_never_on_a_transition(self):
        assert not parse("0 30 1 * * *").on_transition(utc(2026, 10, 25, 1, 30))

    def test_every_is_never_on_a_transition(self):
        assert not parse("@every 30m").on_transition(utc(2026, 3, 29, 1))

    def test_an_instant_outside_the_range_is_on_no_transition(self):
        schedule = parse(f"{NEW_YORK} 0 30 1 * * *")
        assert not schedule.on_transition(datetime.max.replace(tzinfo=UTC))

    def test_a_zone_without_transitions_is_plain_arithmetic(self):
        schedule = parse("CRON_TZ=Asia/Kolkata 0 30 9 * * *")
        assert schedule.next(utc(2026, 6, 1)) == utc(2026, 6, 1, 4)  # +05:30
        assert schedule.prev(utc(2026, 6, 1)) == utc(2026, 5, 31, 4)
