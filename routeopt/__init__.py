"""routeopt: which is the cheapest model that will pass?

Everything installs under this one name. The pipeline's stages live at the top of the
repository (`flows/`, `evals/`, `router_training/`, `artifacts/`) and install as
`routeopt.flows`, `routeopt.evals`, `routeopt.router_training` and `routeopt.artifacts`;
`routeopt.common` and `routeopt.reports` live in this folder.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

# In a source checkout the stage folders sit beside this one rather than inside it, so they are
# found on the package's path there; an installed wheel holds them inside and needs nothing.
_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "router_training" / "__init__.py").is_file() and not (
    Path(__file__).resolve().parent / "router_training"
).exists():
    __path__.append(str(_checkout))  # noqa: F821  (a package's __path__)
