"""Training a policy: routing data, estimators, knob fitting, the certificate and its bounds,
covariate weights toward a traffic sample."""
