"""Publishing: the registry and its server, signing keys, manifest writing, the promotion gate."""
