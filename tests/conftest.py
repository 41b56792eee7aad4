"""Shared pytest setup: fixed hypothesis profile (seeded, no deadlines) and build folder."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "mcf", derandomize=True, deadline=None, max_examples=100,
    suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "mcf"))
