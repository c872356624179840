"""What the pipeline tells people: the run summary printed by the command line, the HTML
dashboard and its charts, and alerts (Prefect events, a webhook).

Reports read every layer below (outcomes, drift, policies, live traffic) and decide nothing:
the decisions they show live with their data (`routeopt.evals.storage.drift`, `routeopt.router_training.live.promise`,
`routeopt.artifacts.publish.promotion`). Only `flows` imports this package.
"""
