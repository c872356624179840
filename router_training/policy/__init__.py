"""What a gateway executes: features (one request and many), the scorer, the knob's choice, the
draws, the policy's files and its conformance vectors. numpy and the standard library only; the
gateway-only install (gateways/python) ships this package as it is."""
