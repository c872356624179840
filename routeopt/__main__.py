"""`python -m routeopt`: the same command line as `routeopt`."""

from routeopt.flows.cli import main

main()
