"""A policy on live traffic: off-policy estimates, its promise on logged requests, the shift monitor."""
