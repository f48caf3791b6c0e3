"""A job module whose registration is refused: the process must fail at start."""

import cronjob

cronjob.register(print, "0 0 0 30 2 *", "feb-30")
