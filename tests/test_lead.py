"""ClaimLead: how far ahead of an instant a claim goes out (``cronjob/_lead.py``)."""

from __future__ import annotations

import pytest

from cronjob.engine._lead import DECAY, LEAD_MAX, MARGIN, ClaimLead


def test_it_starts_at_zero_and_follows_the_slowest_recent_claim_with_a_margin():
    lead = ClaimLead()
    assert lead.seconds == 0
    lead.took(0.004)
    lead.took(0.002)  # faster: the slower one still counts, decayed once
    assert lead.seconds == pytest.approx(0.004 * DECAY * MARGIN)
    lead.took(0.01)  # slower: counts at once
    assert lead.seconds == pytest.approx(0.01 * MARGIN)


def test_a_spike_fades_as_claims_are_fast_again():
    lead = ClaimLead()
    lead.took(0.2)
    for _ in range(60):
        lead.took(0.001)
    assert lead.seconds == pytest.approx(0.001 * MARGIN)


def test_a_database_stall_raises_it_to_its_bound_and_no_further():
    lead = ClaimLead()
    lead.took(30.0)
    assert lead.seconds == pytest.approx(LEAD_MAX)
    lead.took(0.001)
    assert lead.seconds == pytest.approx(LEAD_MAX * DECAY)  # falling from the bound at once


def test_a_negative_duration_is_refused():
    with pytest.raises(ValueError, match="0 seconds or more"):
        ClaimLead().took(-0.001)
