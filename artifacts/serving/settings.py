"""How a gateway process is told which policy to serve: one set of settings, from the environment.

The decision service (`routeopt gateway serve`) and the LiteLLM proxy callback read the same
variables, so a platform team configures both the same way (containers pass settings as
environment variables, and secrets must come from there anyway):

| variable | meaning |
| --- | --- |
| `ROUTEOPT_POLICY` | registry folder, `http(s)://` URL, `s3://` URL, or one version folder (required) |
| `ROUTEOPT_PUBLIC_KEY` | trusted public key(s), PEM paths joined by `:` (read by `routeopt.artifacts.serving.loader`) |
| `ROUTEOPT_DEFAULT_MODEL` | model served while no valid policy is there (read by `routeopt.artifacts.serving.loader`) |
| `ROUTEOPT_CHANNEL` | registry channel (default: `champion`, else `latest`) |
| `ROUTEOPT_REFRESH_S` | seconds between registry polls (default 30; 0: never) |
| `ROUTEOPT_ALLOW_UNSIGNED` | `1` to accept unsigned policies when no public key is given |
| `ROUTEOPT_DECISION_LOG_DIR` | folder for the JSONL decision logs (default: no logs) |
| `ROUTEOPT_PROMPT_HASH_KEY` | key for the logged prompt hashes (keep it secret) |
| `ROUTEOPT_EXPLORATION_RATE` | share of requests sent to a uniformly drawn candidate (default 0) |
| `ROUTEOPT_SHADOW` | `1` to log the candidate channel's decision beside the served one |
| `ROUTEOPT_CANARY_SHARE` | share of request ids the candidate channel serves (default 0) |

A value that cannot be read is a `SettingsError` naming the variable; nothing is guessed.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from routeopt.artifacts.serving.gateway import Exploration, Gateway
from routeopt.artifacts.serving.loader import PolicyLoadError
from routeopt.artifacts.serving.signatures import SigningError

log = logging.getLogger("routeopt.gateway")

POLICY_ENV = "ROUTEOPT_POLICY"
HASH_KEY_ENV = "ROUTEOPT_PROMPT_HASH_KEY"
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


class SettingsError(ValueError):
    """A setting has a value the gateway cannot use (the message names it)."""


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in _TRUE | _FALSE:
        return value in _TRUE
    raise SettingsError(f"${name} is {env[name]!r}; use 1 or 0")


def _number(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"${name} is {text!r}, not a number") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise SettingsError(f"${name} is {text}; it must lie in [{low:g}, {high:g}]")
    return value


@dataclass(frozen=True)
class GatewaySettings:
    """Which policy a gateway serves and how it logs; `open()` builds the `Gateway`.

    `public_keys` empty and `default_model` None defer to `$ROUTEOPT_PUBLIC_KEY` and
    `$ROUTEOPT_DEFAULT_MODEL`, which `routeopt.artifacts.serving.loader.load` reads itself.
    """

    source: str
    public_keys: tuple[str, ...] = ()
    channel: str | None = None
    refresh_s: float = 30.0
    default_model: str | None = None
    allow_unsigned: bool = False
    log_dir: str | None = None
    exploration_rate: float = 0.0
    shadow: bool = False
    canary_share: float = 0.0

    def __post_init__(self) -> None:
        if not self.source:
            raise SettingsError(f"no policy to serve: set ${POLICY_ENV} (a registry URL or folder)")
        if not (math.isfinite(self.refresh_s) and self.refresh_s >= 0):
            raise SettingsError(f"refresh_s must be a number >= 0, got {self.refresh_s!r}")
        for name in ("exploration_rate", "canary_share"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 <= value <= 1):
                raise SettingsError(f"{name} must lie in [0, 1], got {value!r}")
        if self.channel and (self.shadow or self.canary_share):
            raise SettingsError(
                "shadow and canary compare the champion and candidate channels; unset the channel to use them"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "GatewaySettings":
        """Settings from the environment; keyword arguments that are not None win over it."""
        env = os.environ if env is None else env
        read = dict(
            source=env.get(POLICY_ENV, "").strip(),
            channel=env.get("ROUTEOPT_CHANNEL", "").strip() or None,
            refresh_s=_number(env, "ROUTEOPT_REFRESH_S", 30.0, 0.0, 86400.0),
            allow_unsigned=_flag(env, "ROUTEOPT_ALLOW_UNSIGNED"),
            log_dir=env.get("ROUTEOPT_DECISION_LOG_DIR", "").strip() or None,
            exploration_rate=_number(env, "ROUTEOPT_EXPLORATION_RATE", 0.0, 0.0, 1.0),
            shadow=_flag(env, "ROUTEOPT_SHADOW"),
            canary_share=_number(env, "ROUTEOPT_CANARY_SHARE", 0.0, 0.0, 1.0),
        )
        read.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**read)

    def open(self, on_event: Callable[[str, str], None] | None = None) -> Gateway:
        """Load, verify and (with `refresh_s`) keep refreshing the policy; start the log writer.

        Raises `routeopt.artifacts.serving.loader.PolicyLoadError` when no policy is valid and no default model
        is set, and `routeopt.artifacts.serving.signatures.SigningError` for an unreadable public key."""
        exploration = Exploration(rate=self.exploration_rate) if self.exploration_rate else None
        hash_key = os.environb.get(HASH_KEY_ENV.encode()) or None
        channel = {"channel": self.channel} if self.channel else {}
        return Gateway.open(
            self.source,
            list(self.public_keys) or None,
            **channel,
            refresh_s=self.refresh_s or None,
            on_event=on_event,
            allow_unsigned=self.allow_unsigned,
            default_model=self.default_model,
            log_dir=self.log_dir,
            hash_key=hash_key,
            exploration=exploration,
            shadow=self.shadow,
            canary_share=self.canary_share,
        )


class GatewayLoader:
    """Opens the gateway from settings, and keeps trying while no policy can be loaded yet.

    A gateway process that starts before anything is published, or while the registry is down,
    must not fail (a LiteLLM proxy would take every other model down with it): `gateway` stays
    None, `reason` says why, and a thread retries every `refresh_s` (30 s when 0). An unusable
    key or setting is a configuration error: `start()` raises it, since waiting cannot fix it.
    """

    def __init__(self, settings: GatewaySettings, on_event: Callable[[str, str], None] | None = None) -> None:
        self.settings, self.on_event = settings, on_event
        self.gateway: Gateway | None = None
        self.reason: str | None = "starting"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _open(self) -> Gateway:
        try:
            return self.settings.open(on_event=self.on_event)
        except SigningError as exc:
            raise PolicyLoadError(f"cannot verify policies: {exc}", "config") from None

    def start(self) -> "GatewayLoader":
        if self.gateway is not None or self._thread is not None:
            return self
        try:
            self.gateway, self.reason = self._open(), None
        except PolicyLoadError as exc:
            if exc.kind == "config":
                raise
            self.reason = f"no policy loaded yet: {exc}"
            log.warning("%s; retrying every %g s", self.reason, self._every())
            self._thread = threading.Thread(
                target=self._keep_trying, name="routeopt-gateway-load", daemon=True
            )
            self._thread.start()
        return self

    def _every(self) -> float:
        return self.settings.refresh_s or 30.0

    def _keep_trying(self) -> None:
        while not self._stop.wait(self._every()):
            try:
                gateway = self._open()
            except PolicyLoadError as exc:
                self.reason = f"no policy loaded yet: {exc}"
                if self.on_event is not None:
                    self.on_event("unreachable" if exc.kind == "unreachable" else "rejected", str(exc))
                continue
            self.gateway, self.reason = gateway, None
            log.warning("a policy is loaded; routing starts")
            return

    def close(self) -> None:
        """Stop retrying, stop the refreshers and write what the decision log holds."""
        self._stop.set()
        if self.gateway is not None:
            self.gateway.close()
