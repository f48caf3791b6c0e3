"""examples/fastapi_app.py: the real application object under an ASGI test client.

In a process of its own: the example registers on the default registry, which a
scheduler's start closes to further registrations.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests._process import lease_names

REPO = Path(__file__).resolve().parents[1]

CLIENT = """
from fastapi.testclient import TestClient
from examples.fastapi_app import app

with TestClient(app) as client:
    print(client.get("/ready").json())
print(app.state.cronjob_scheduler.ready)
"""


def test_the_example_app_starts_its_scheduler_with_its_lifespan_and_drains_it(tmp_path):
    database = tmp_path / "app.sqlite"
    done = subprocess.run(
        [sys.executable, "-c", CLIENT],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "CRONJOB_DATABASE_URL": f"sqlite+aiosqlite:///{database}",
        },
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["{'cronjob': True}", "False"]
    assert lease_names(database) == ["fastapi-digest"]
