"""The gateway side: load and verify a policy, route, log, explore, and the front ends (decision
service, LiteLLM). Imports only routeopt.router_training.policy and routeopt.common of ours."""
