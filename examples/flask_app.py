"""A Flask application with a job run once per instant across its replicas.

export FLASK_CRONJOB_DATABASE_URL=postgresql+psycopg://app@db/app
flask --app examples.flask_app cronjob run    # the scheduler, a process of its own
flask --app examples.flask_app run            # the web application, as many as you like
"""

from __future__ import annotations

from typing import Any

from flask import Flask

import cronjob
from cronjob.contrib.flask import Cronjob

scheduler_ext = Cronjob()


@cronjob.job("0 */5 * * * *", name="flask-digest")
def digest(ctx: cronjob.Round) -> None:
    with ctx.transaction() as conn:  # fenced by the round's lease
        conn.exec_driver_sql("SELECT 1")


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config["CRONJOB_DATABASE_URL"] = "sqlite:///flask_app.sqlite"
    app.config.from_prefixed_env()  # FLASK_CRONJOB_DATABASE_URL=... overrides it
    app.config.update(config or {})
    scheduler_ext.init_app(app)

    @app.get("/")
    def index() -> str:
        return "hello"

    return app
