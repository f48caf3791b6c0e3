"""The ``cronjob next`` command (and the argument handling of ``cronjob run``)."""

from __future__ import annotations

import sys
import types
from datetime import UTC, datetime

import pytest

from cronjob.admin._cli import main
from tests._process import run_python


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def next_lines(capsys, *argv: str) -> list[str]:
    """The lines ``cronjob next ARGV`` prints; it must exit 0."""
    status, out, _ = run(capsys, "next", *argv)
    assert status == 0
    return out.splitlines()


class TestNext:
    def test_it_prints_a_header_and_five_instants_by_default(self, capsys):
        status, out, err = run(capsys, "next", "0 */15 * * * *", "--after", "2026-01-01T00:00:00Z")
        assert status == 0
        assert err == ""
        assert out.splitlines() == [
            "next 5 instants of '0 */15 * * * *' (UTC) after 2026-01-01T00:00:00+00:00:",
            "  2026-01-01T00:15:00+00:00",
            "  2026-01-01T00:30:00+00:00",
            "  2026-01-01T00:45:00+00:00",
            "  2026-01-01T01:00:00+00:00",
            "  2026-01-01T01:15:00+00:00",
        ]

    @pytest.mark.parametrize(
        ("spec", "after", "listed"),
        [
            pytest.param(
                "@daily",
                "2026-01-01T12:00Z",
                ["  2026-01-02T00:00:00+00:00", "  2026-01-03T00:00:00+00:00"],
                id="n-sets-how-many",
            ),
            pytest.param(
                "@yearly",
                "9998-06-01T00:00Z",
                [
                    "  9999-01-01T00:00:00+00:00",
                    "  (no further instant up to the end of year 9999)",
                ],
                id="it-says-when-there-is-no-further-instant",
            ),
        ],
    )
    def test_n_2_lists_two_instants_or_what_there_is(self, capsys, spec, after, listed):
        assert next_lines(capsys, spec, "-n", "2", "--after", after)[1:] == listed

    def test_a_zoned_spec_shows_local_time_and_marks_a_skipped_time(self, capsys):
        # New York, Sunday 2026-03-08: 02:00 EST (07:00Z) jumps to 03:00 EDT.
        lines = next_lines(
            capsys,
            "CRON_TZ=America/New_York 0 30 2 * * *",
            "-n",
            "3",
            "--after",
            "2026-03-07T00:00:00Z",
        )
        assert lines == [
            "next 3 instants of 'CRON_TZ=America/New_York 0 30 2 * * *' "
            "(zone America/New_York, fixed-time DST rule) after 2026-03-07T00:00:00+00:00:",
            "  2026-03-07T07:30:00+00:00  2026-03-07T02:30:00-05:00",
            "  2026-03-08T07:00:00+00:00  2026-03-08T03:00:00-04:00  "
            "[DST: local time skipped -> first instant after the gap]",
            "  2026-03-09T06:30:00+00:00  2026-03-09T02:30:00-04:00",
        ]

    def test_a_wildcard_spec_marks_both_passes_of_a_repeated_hour(self, capsys):
        # London, Sunday 2026-10-25: 02:00 BST (01:00Z) goes back to 01:00 GMT.
        lines = next_lines(
            capsys,
            "CRON_TZ=Europe/London 0 0 * * * *",
            "-n",
            "3",
            "--after",
            "2026-10-24T23:30:00Z",
        )
        assert lines[1:] == [
            "  2026-10-25T00:00:00+00:00  2026-10-25T01:00:00+01:00  "
            "[DST: repeated local time, first pass]",
            "  2026-10-25T01:00:00+00:00  2026-10-25T01:00:00+00:00  "
            "[DST: repeated local time, second pass]",
            "  2026-10-25T02:00:00+00:00  2026-10-25T02:00:00+00:00",
        ]
        assert "wildcard DST rule" in lines[0]

    def test_every_names_its_grid(self, capsys):
        lines = next_lines(capsys, "@every 90s", "-n", "1", "--after", "2026-01-01")
        assert lines == [
            "next 1 instant of '@every 90s' (every 90s from the Unix epoch, UTC) "
            "after 2026-01-01T00:00:00+00:00:",
            "  2026-01-01T00:01:30+00:00",
        ]

    def test_an_after_without_offset_is_utc(self, capsys):
        _, naive, _ = run(capsys, "next", "0 0 * * * *", "--after", "2026-01-01T10:30:00")
        _, utc, _ = run(capsys, "next", "0 0 * * * *", "--after", "2026-01-01T10:30:00+00:00")
        assert naive == utc

    def test_an_after_with_an_offset_is_that_instant(self, capsys):
        _, out, _ = run(
            capsys, "next", "0 0 * * * *", "-n", "1", "--after", "2026-01-01T10:30+02:00"
        )
        assert out.splitlines()[1] == "  2026-01-01T09:00:00+00:00"

    def test_without_after_it_starts_now(self, capsys):
        before = datetime.now(UTC)
        lines = next_lines(capsys, "* * * * * *", "-n", "1")
        first = datetime.fromisoformat(lines[1].strip())
        assert before < first

    def test_help_says_a_naive_after_is_utc(self, capsys):
        status, out, _ = run(capsys, "next", "--help")
        assert status == 0
        assert "offset is UTC" in " ".join(out.split())


class TestBadInput:
    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (
                ["next", "*/5 * * * *"],
                "cronjob: error: '*/5 * * * *' has 5 fields, but cron specs here have six, "
                "seconds first: write '0 */5 * * * *' to fire at second 0",
            ),
            (
                ["next", "CRON_TZ=Local @daily"],
                "cronjob: error: zone 'Local' in 'CRON_TZ=Local @daily' is refused: the replicas "
                "of a deployment need not share a local zone; name an IANA zone such as "
                "'Europe/Berlin'",
            ),
            (
                ["next", "@daily", "-n", "0"],
                "cronjob: error: argument -n: must be at least 1, got 0",
            ),
            (
                ["next", "@daily", "-n", "many"],
                "cronjob: error: argument -n: must be a whole number, got 'many'",
            ),
            (
                ["next", "@daily", "--after", "yesterday"],
                "cronjob: error: argument --after: 'yesterday' is not an ISO 8601 time, "
                "e.g. 2026-03-08T06:00:00Z",
            ),
            (["next"], "cronjob: error: the following arguments are required: SPEC"),
            ([], "cronjob: error: the following arguments are required: COMMAND"),
            (
                ["frobnicate"],
                "cronjob: error: argument COMMAND: invalid choice: 'frobnicate' "
                "(choose from 'next', 'run', 'beat', 'stream-worker', 'status', 'history', "
                "'schedules', 'pause', 'resume', 'trigger', 'forget', 'backfill', 'missed')",
            ),
        ],
    )
    def test_it_prints_one_line_and_exits_2(self, capsys, argv, message):
        status, out, err = run(capsys, *argv)
        assert status == 2
        assert out == ""
        assert err == message + "\n"


class TestRunSubcommand:
    def test_it_hands_its_arguments_to_run_command(self, capsys, monkeypatch):
        seen = []
        fake = types.ModuleType("cronjob.admin._run")
        fake.run_command = lambda args: seen.append(args) or 7  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "cronjob.admin._run", fake)
        status = main(["run", "--database-url", "sqlite:///x.db", "app.jobs", "app.more"])
        assert status == 7
        assert seen[0].database_url == "sqlite:///x.db"
        assert seen[0].modules == ["app.jobs", "app.more"]

    def test_the_database_url_is_optional(self, monkeypatch):
        seen = []
        fake = types.ModuleType("cronjob.admin._run")
        fake.run_command = lambda args: seen.append(args) or 0  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "cronjob.admin._run", fake)
        assert main(["run", "app.jobs"]) == 0
        assert seen[0].database_url is None

    def test_it_needs_a_module(self, capsys):
        status, _, err = run(capsys, "run")
        assert status == 2
        assert err == "cronjob: error: the following arguments are required: MODULE\n"


class TestModuleEntryPoint:
    def test_python_dash_m_cronjob_runs_the_cli(self):
        done = run_python("-m", "cronjob", "next", "@hourly", "-n", "1", "--after", "2026-01-01")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[1] == "  2026-01-01T01:00:00+00:00"

    def test_python_dash_m_cronjob_exits_2_on_bad_input(self):
        done = run_python("-m", "cronjob", "next", "@often")
        assert done.returncode == 2
        assert done.stderr.startswith("cronjob: error: unknown descriptor '@often'")
        assert "Traceback" not in done.stderr
