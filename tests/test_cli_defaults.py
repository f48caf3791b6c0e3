"""The keywords through which manage.py cronjob and flask cronjob are the cronjob command.

That the framework's database becomes ``--database-url``'s default, and that a URL on
the command line wins, is shown by running the commands (tests/test_django.py,
tests/test_flask.py).
"""

from __future__ import annotations

from cronjob.admin._cli import main


def test_run_needs_a_module_from_the_plain_command(capsys):
    assert main(["run"]) == 2
    assert capsys.readouterr().err == (
        "cronjob: error: the following arguments are required: MODULE\n"
    )


def test_run_needs_no_module_once_a_framework_imported_the_jobs(capsys):
    assert main(["run", "--help"], prog="manage.py cronjob", jobs_imported=True) == 0
    usage = " ".join(capsys.readouterr().out.split("\n\n")[0].split())
    assert usage == (
        "usage: manage.py cronjob run [-h] [--database-url URL] [--max-workers N] [MODULE ...]"
    )


def test_a_command_without_database_url_ignores_the_default(capsys):
    status = main(
        ["next", "@daily", "-n", "1", "--after", "2026-03-02T08:00:00Z"],
        database_url="sqlite:///unused.sqlite",
    )
    assert status == 0
    assert capsys.readouterr().out.splitlines()[1] == "  2026-03-03T00:00:00+00:00"


def test_run_refuses_a_max_workers_below_one(capsys):
    assert main(["run", "--max-workers", "0", "jobs"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "cronjob: error: argument --max-workers: must be a whole number of at least 1, not '0'"
    )


def test_beat_gives_its_hand_off_rounds_more_threads_than_run():
    """A hand-off's round mostly waits: beat's default lets every round of a busy
    instant have a thread (its records and marks then share one transaction each)."""
    from cronjob.admin._cli import _build_parser

    parser = _build_parser("cronjob", jobs_imported=False)
    assert parser.parse_args(["beat", "-A", "proj"]).max_workers == 256
    assert parser.parse_args(["run", "jobs"]).max_workers == 64
    assert parser.parse_args(["beat", "-A", "proj", "--max-workers", "8"]).max_workers == 8
