"""Properties of parse() and Schedule over generated specs, times and garbage.

The oracle here knows nothing of the implementation: it builds each field's value set
from the generated text with ``range()``, enumerates matching local wall times day by
day, and maps them to instants with PEP 495 ``fold`` and the DST rule of SPEC.md.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cronjob import ScheduleError, parse
from cronjob._calendar import civil_from_days, days_from_civil, transitions_in_year

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ZONES = [
    None,
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",
    "Pacific/Apia",
    "Pacific/Chatham",
    "Asia/Kathmandu",
    "America/Santiago",
    "America/Havana",
    "Africa/Casablanca",
]
MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
WEEKDAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
PARSE_BOUND = 0.1  # seconds: a bound on a hang, not a benchmark
COMMON = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Warm up: the first parse imports croniter and the first zone loads its file.
parse("CRON_TZ=Europe/London 0 0 0 * * *")


@dataclass(frozen=True)
class Field:
    name: str
    low: int
    high: int  # the highest value a number may have (7 for day-of-week)
    top: int  # where '*' and 'a/n' stop (6 for day-of-week)
    names: list[str] | None = None


SECOND = Field("second", 0, 59, 59)
MINUTE = Field("minute", 0, 59, 59)
HOUR = Field("hour", 0, 23, 23)
DAY = Field("day-of-month", 1, 31, 31)
MONTH = Field("month", 1, 12, 12, MONTHS)
WEEKDAY = Field("day-of-week", 0, 7, 6, WEEKDAYS)


def spell(field: Field, value: int, draw) -> str:
    if field.names and value - field.low < len(field.names) and draw(st.booleans()):
        name = field.names[value - field.low]
        return draw(st.sampled_from([name, name.lower(), name.title()]))
    return str(value)


@st.composite
def elements(draw, field: Field) -> tuple[str, set[int]]:
    """One list element and the values it stands for."""
    kind = draw(st.sampled_from(["value", "range", "range-step", "value-step", "star"]))
    if kind == "star":  # a star inside a list: '*' or '*/n'
        step = draw(st.integers(1, field.top + 2))
        text = "*" if step == 1 and draw(st.booleans()) else f"*/{step}"
        return text, set(range(field.low, field.top + 1, step))
    a = draw(st.integers(field.low, field.high))
    if kind == "value":
        return spell(field, a, draw), {a}
    if kind == "value-step":
        step = draw(st.integers(1, field.top + 2))
        return f"{spell(field, a, draw)}/{step}", set(range(a, max(a, field.top) + 1, step))
    b = draw(st.integers(a, field.high))
    text = f"{spell(field, a, draw)}-{spell(field, b, draw)}"
    if kind == "range":
        return text, set(range(a, b + 1))
    step = draw(st.integers(1, field.high - field.low + 2))
    return f"{text}/{step}", set(range(a, b + 1, step))


@st.composite
def fields(draw, field: Field, *, small: bool = False) -> tuple[str, set[int]]:
    """A whole field, and its value set; `small` keeps the set to at most two values."""
    if small:
        values = draw(st.lists(st.integers(field.low, field.top), min_size=1, max_size=2))
        return ",".join(map(str, values)), set(values)
    choices = ["star", "star-step", "list"]
    if field in (DAY, WEEKDAY):
        choices.append("question")
    kind = draw(st.sampled_from(choices))
    everything = set(range(field.low, field.top + 1))
    if kind == "star":
        return "*", everything
    if kind == "question":
        return "?", everything
    if kind == "star-step":
        step = draw(st.integers(1, field.top + 2))
        return f"*/{step}", set(range(field.low, field.top + 1, step))
    parts = draw(st.lists(elements(field), min_size=1, max_size=3))
    values: set[int] = set()
    for _, part in parts:
        values |= part
    return ",".join(text for text, _ in parts), values


@dataclass(frozen=True)
class Model:
    """A generated cron spec and what it means, worked out without cronjob."""

    text: str
    zone: str | None
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    both_needed: bool  # a day field is unrestricted (robfig's star bit): AND, else OR
    fixed_time: bool

    @property
    def spec(self) -> str:
        return f"CRON_TZ={self.zone} {self.text}" if self.zone else self.text

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        day_ok = day.day in self.days
        weekday_ok = day.isoweekday() % 7 in self.weekdays
        return (day_ok and weekday_ok) if self.both_needed else (day_ok or weekday_ok)

    def ever_fires(self) -> bool:
        if not self.both_needed:
            return True
        longest = {2: 29, 4: 30, 6: 30, 9: 30, 11: 30}
        return any(day <= longest.get(month, 31) for month in self.months for day in self.days)


@st.composite
def models(draw, *, small_seconds: bool = False) -> Model:
    second, seconds = draw(fields(SECOND, small=small_seconds))
    minute, minutes = draw(fields(MINUTE))
    hour, hours = draw(fields(HOUR))
    day, days = draw(fields(DAY))
    month, months = draw(fields(MONTH))
    weekday, weekdays = draw(fields(WEEKDAY))
    return Model(
        text=" ".join([second, minute, hour, day, month, weekday]),
        zone=draw(st.sampled_from(ZONES)),
        seconds=frozenset(seconds),
        minutes=frozenset(minutes),
        hours=frozenset(hours),
        days=frozenset(days),
        months=frozenset(months),
        weekdays=frozenset(value % 7 for value in weekdays),
        both_needed=_unrestricted(day) or _unrestricted(weekday),
        fixed_time=not any(text.startswith("*") for text in (second, minute, hour)),
    )


descriptors = st.sampled_from(
    ["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"]
)
every_specs = st.integers(1, 10 * 86_400).map(lambda seconds: f"@every {seconds}s")


@st.composite
def zoned_descriptors(draw) -> str:
    zone = draw(st.sampled_from(ZONES))
    descriptor = draw(descriptors)
    return f"CRON_TZ={zone} {descriptor}" if zone else descriptor


times = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


@st.composite
def times_near_transitions(draw, zone: str | None) -> datetime:
    """Half the time uniformly random; half within two days of one of the zone's transitions."""
    if zone is None or draw(st.booleans()):
        return draw(times)
    year = draw(st.integers(1970, 2100))
    transitions = transitions_in_year(ZoneInfo(zone), year)
    assume(transitions)
    transition = draw(st.sampled_from(transitions))
    return EPOCH + timedelta(seconds=transition.at + draw(st.integers(-2 * 86_400, 2 * 86_400)))


garbage = st.one_of(
    st.text(max_size=60),
    st.text(alphabet="0123456789*/-,?LWH#R @:=.JANMONsunhmsxy\t", max_size=40),
    st.lists(
        st.sampled_from(
            [
                "*",
                "?",
                "0",
                "7",
                "59",
                "60",
                "*/0",
                "1-5",
                "5-1",
                "MON",
                "JAN",
                "L",
                "1#2",
                "15W",
                "H",
                "@every",
                "@daily",
                "5m",
                "1.5s",
                "-1",
                "CRON_TZ=Europe/London",
                "TZ=Local",
                "CRON_TZ=Nowhere",
                "",
                ",",
                "/",
            ]
        ),
        max_size=8,
    ).map(" ".join),
)


def timed_parse(spec: str):
    """Parse, asserting it took under PARSE_BOUND of this thread's CPU time.

    CPU time, and no garbage collection meanwhile, so that a loaded machine or a
    collection of Hypothesis's own garbage cannot fail the test: it is after hangs.
    """
    gc.disable()
    started = time.thread_time()
    try:
        return parse(spec)
    finally:
        elapsed = time.thread_time() - started
        gc.enable()
        assert elapsed < PARSE_BOUND, f"parse({spec!r}) took {elapsed:.3f}s"


class TestParse:
    @COMMON
    @given(garbage)
    def test_garbage_raises_nothing_but_schedule_error_and_never_hangs(self, spec):
        with contextlib.suppress(ScheduleError):
            timed_parse(spec)

    @COMMON
    @given(models())
    def test_a_well_formed_spec_is_refused_only_if_it_never_fires(self, model):
        try:
            schedule = timed_parse(model.spec)
        except ScheduleError as exc:
            assert "never fires" in str(exc)
            assert not model.ever_fires()
        else:
            assert model.ever_fires()
            assert schedule.fixed_time is model.fixed_time


def check_instants(spec: str, moment: datetime) -> None:
    schedule = parse(spec)
    later = schedule.next(moment)
    assume(later is not None)
    assert later is not None and later > moment
    assert later.tzinfo is UTC and later.microsecond == 0
    # The instants that follow keep increasing.
    previous = later
    for _ in range(4):
        following = schedule.next(previous)
        assert following is not None and following > previous
        previous = following
    # prev() and next() agree in both directions.
    back = schedule.prev(later)
    assert back is None or back <= moment
    earlier = schedule.prev(moment)
    if earlier is not None:
        assert earlier < moment
        assert earlier.tzinfo is UTC and earlier.microsecond == 0
        after_earlier = schedule.next(earlier)
        assert after_earlier is not None and after_earlier >= moment


class TestInstants:
    @COMMON
    @given(st.data())
    def test_cron_specs_keep_their_invariants(self, data):
        model = data.draw(models())
        assume(model.ever_fires())
        check_instants(model.spec, data.draw(times_near_transitions(model.zone)))

    @COMMON
    @given(zoned_descriptors(), times)
    def test_descriptors_keep_their_invariants(self, spec, moment):
        check_instants(spec, moment)

    @COMMON
    @given(every_specs, times)
    def test_every_keeps_its_invariants_and_the_epoch_grid(self, spec, moment):
        check_instants(spec, moment)
        schedule = parse(spec)
        found = schedule.next(moment)
        assert found is not None
        assert int((found - EPOCH).total_seconds()) % (schedule.period or 0) == 0
        assert found - moment <= timedelta(seconds=schedule.period or 0)

    @COMMON
    @given(times, st.sampled_from(ZONES[1:]))
    def test_any_zone_may_ask(self, moment, zone):
        """The zone of the datetime passed in changes nothing: instants are instants."""
        schedule = parse("0 */7 * * * *")
        assert schedule.next(moment.astimezone(ZoneInfo(zone))) == schedule.next(moment)


def oracle(model: Model, low: int, high: int) -> list[int]:
    """Every instant of `model` in (low, high], by brute force over local wall times."""
    zone = ZoneInfo(model.zone) if model.zone else None
    found: set[int] = set()
    first = (EPOCH + timedelta(seconds=low)).date() - timedelta(days=2)
    last = (EPOCH + timedelta(seconds=high)).date() + timedelta(days=2)
    day = first
    while day <= last:
        if model.day_matches(day):
            for hour in model.hours:
                for minute in model.minutes:
                    for second in model.seconds:
                        wall = datetime(day.year, day.month, day.day, hour, minute, second)
                        found.update(wall_to_instants(wall, zone, model.fixed_time))
        day += timedelta(days=1)
    return sorted(instant for instant in found if low < instant <= high)


def wall_to_instants(wall: datetime, zone: ZoneInfo | None, fixed_time: bool) -> list[int]:
    if zone is None:
        return [int(wall.replace(tzinfo=UTC).timestamp())]
    early = int(wall.replace(tzinfo=zone, fold=0).timestamp())
    late = int(wall.replace(tzinfo=zone, fold=1).timestamp())
    if early == late:
        return [early]

    def reads(instant: int) -> datetime:
        return datetime.fromtimestamp(instant, zone).replace(tzinfo=None)

    if reads(early) == wall and reads(late) == wall:  # repeated: two real instants
        return [min(early, late)] if fixed_time else sorted({early, late})
    if not fixed_time:  # skipped: nothing to follow in real time
        return []
    # Skipped, fixed-time: the first instant whose local reading is past the wall time.
    before, after = min(early, late), max(early, late)
    while after - before > 1:
        middle = (before + after) // 2
        if reads(middle) > wall:
            after = middle
        else:
            before = middle
    return [after]


class TestAgainstOracle:
    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def test_next_lists_exactly_the_instants_brute_force_finds(self, data):
        model = data.draw(models(small_seconds=True))
        assume(model.ever_fires())
        start = data.draw(times_near_transitions(model.zone))
        low = int((start - EPOCH).total_seconds())
        high = low + 2 * 86_400
        expected = oracle(model, low, high)
        schedule = parse(model.spec)
        found = []
        moment = start
        while (moment := schedule.next(moment)) is not None and moment <= EPOCH + timedelta(
            seconds=high
        ):
            found.append(int((moment - EPOCH).total_seconds()))
        assert found == expected


class TestCalendar:
    @COMMON
    @given(st.dates())
    def test_day_counts_match_the_standard_library(self, day):
        days = days_from_civil(day.year, day.month, day.day)
        assert days == day.toordinal() - date(1970, 1, 1).toordinal()
        assert civil_from_days(days) == (day.year, day.month, day.day)

    @COMMON
    @given(st.integers(-(10**7), 10**7))
    def test_day_counts_round_trip_beyond_the_datetime_range(self, days):
        assert days_from_civil(*civil_from_days(days)) == days


def _unrestricted(field: str) -> bool:
    """robfig/cron's star bit: one list element is '*' or '?' with no step above 1."""
    return any(
        part.split("/")[0] in ("*", "?") and ("/" not in part or int(part.split("/")[1]) <= 1)
        for part in field.split(",")
    )
