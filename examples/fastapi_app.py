"""A FastAPI application whose scheduler starts and drains with it.

    export CRONJOB_DATABASE_URL=postgresql+psycopg://app@db/app
    uvicorn examples.fastapi_app:app --workers 4   # every worker is a replica

Each instant of ``fastapi-digest`` runs once across all workers of all hosts; the async
job runs on the application's own event loop.
"""

from __future__ import annotations

from fastapi import FastAPI, Request

import cronjob


@cronjob.job("0 */5 * * * *", name="fastapi-digest")
async def digest(ctx: cronjob.Round) -> None:
    async with ctx.transaction_async() as conn:  # fenced by the round's lease
        await conn.exec_driver_sql("SELECT 1")


app = FastAPI(lifespan=cronjob.lifespan())  # the database: $CRONJOB_DATABASE_URL


@app.get("/ready")
def ready(request: Request) -> dict[str, bool]:
    """For a readiness probe: the scheduler reached its database."""
    return {"cronjob": request.app.state.cronjob_scheduler.ready}
