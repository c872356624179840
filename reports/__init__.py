"""What the pipeline tells people: the run summary printed by the command line, the HTML
dashboard and its charts, and alerts (Prefect events, a webhook).

Reports read every layer below (outcomes, drift, policies, live traffic) and decide nothing:
the decisions they show live with their data (`evals.storage.drift`, `router_training.live`,
`artifacts.promotion`). Only `flows` imports this package.
"""
