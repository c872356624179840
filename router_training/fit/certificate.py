"""What a policy's certificate assumes of its traffic, and the inputs the knob needs for it.

`routeopt train` certifies the knob for requests like the calibration requests (drawn like the
eval suites) unless told otherwise:

* `--traffic LOG_OR_FILE`: unlabelled production requests are known; the calibration requests
  are weighted toward them (`routeopt.router_training.fit.covariate`), the reference is the best single
  candidate unless another one wins on the weighted data with the certificate's confidence,
  and the certificate rests on the weights' effective sample size. Where text was kept, the weights read the policy's text features; a decision log
  without text gives suites and lengths only.
* `--robust GAMMA`: nothing is known; the certificate holds for every traffic whose mix over
  (suite x difficulty band) cells is within a factor GAMMA of the calibration mix.

The manifest records which (`Assumption.to_dict()`), with the weights' summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import norm

from routeopt.router_training.fit.bounds import Assumption, difficulty_cells
from routeopt.router_training.fit.covariate import Sketch, Weights, density_ratio, text_features


@dataclass
class TrafficSample:
    """Unlabelled traffic: prompts where text was kept (with suites), else a sketch of suites
    and prompt lengths."""

    suites: list[str | None]
    chars: np.ndarray
    prompts: list[str] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        self.chars = np.asarray(self.chars, dtype=np.float64)
        if self.prompts is not None and len(self.prompts) != len(self.suites):
            raise ValueError(
                f"a traffic sample has {len(self.prompts)} prompts but {len(self.suites)} suites"
            )

    def __len__(self) -> int:
        return len(self.suites)

    @classmethod
    def of_prompts(
        cls, prompts: list[str], suites: list[str | None] | None = None, source: str = ""
    ) -> "TrafficSample":
        suites = list(suites) if suites is not None else [None] * len(prompts)
        return cls(suites, np.array([len(p) for p in prompts]), list(prompts), source=source)


@dataclass
class Basis:
    """The knob's inputs for one certificate: what it assumes, and the calibration requests'
    weights or cells."""

    assumption: Assumption
    weights: np.ndarray | None = None
    cells: np.ndarray | None = None

    def reference(self, Y: np.ndarray, confidence: float = 0.95) -> int:
        """The best single candidate on the calibration requests: the unweighted best, unless
        another candidate beats it on the weighted requests with the certificate's confidence
        (one-sided lower bound of the weighted paired margin, on the weights' effective sample
        size, above 0). A plain argmax of weighted rates follows the few heavy requests: with
        an effective sample of ~60, alpacaeval's weights picked a GPT-4 that was no better."""
        seen = ~np.isnan(Y)
        rates = np.where(seen, Y, 0.0).sum(0) / np.maximum(seen.sum(0), 1)
        best = int(np.argmax(np.where(seen.any(0), rates, -1.0)))
        if self.weights is None:
            return best
        z = float(norm.ppf(confidence))
        chosen, bound = best, 0.0
        for k in range(Y.shape[1]):
            both = seen[:, k] & seen[:, best]
            if k == best or not both.any():
                continue
            d, w = Y[both, k] - Y[both, best], self.weights[both]
            mean = float((w * d).sum() / w.sum())
            se = float(np.sqrt((w**2 * (d - mean) ** 2).sum()) / w.sum())
            if mean - z * se > bound:
                chosen, bound = k, mean - z * se
        return chosen

    def reference_rate(self, Y: np.ndarray, ref: int) -> float:
        """The reference's (weighted) pass rate over the calibration requests it was measured on."""
        seen = ~np.isnan(Y[:, ref])
        w = np.ones(len(Y)) if self.weights is None else self.weights
        return float((Y[seen, ref] * w[seen]).sum() / w[seen].sum()) if seen.any() else float("nan")


@dataclass(frozen=True)
class Certificate:
    """The user's choice: exchangeable (default), toward a traffic sample, or robust (gamma)."""

    traffic: TrafficSample | None = None
    robust: float | None = None
    max_weight: float = 20.0

    def __post_init__(self) -> None:
        if self.traffic is not None and self.robust is not None:
            raise ValueError("choose one certificate: toward a traffic sample, or robust; not both")
        if self.robust is not None and not self.robust >= 1:
            raise ValueError(f"the robust certificate's gamma must be >= 1, got {self.robust}")

    def basis(self, fitted: Any, data: Any, policy: Any) -> Basis:
        """Weights or cells for `fitted` (a `train.Calibrated`) on `data`, read by `policy`."""
        if self.robust is not None:
            score = fitted.cal.P[:, fitted.ref]
            cells = difficulty_cells(list(data.suites), score)
            assumption = Assumption(
                "robust",
                gamma=float(self.robust),
                cells=f"{len(np.unique(cells))} (suite x 3 bands of the reference's predicted pass rate)",
            )
            return Basis(assumption, cells=cells)
        if self.traffic is None:
            return Basis(Assumption())
        w = self.weights(data, policy)
        info = {"source": self.traffic.source, **w.summary()}
        return Basis(Assumption("traffic", traffic=info), weights=w.w)

    def weights(self, data: Any, policy: Any) -> Weights:
        """Density-ratio weights of the calibration requests toward the traffic sample."""
        t = self.traffic
        assert t is not None
        suites = sorted({s for s in data.suites if s})
        chars = np.array([len(p) for p in data.prompts])
        if t.prompts is not None:
            calibration = Sketch(list(data.suites), chars, text_features(policy, data.prompts, data.suites))
            traffic = Sketch(t.suites, t.chars, text_features(policy, t.prompts, t.suites))
        else:
            calibration, traffic = Sketch(list(data.suites), chars), Sketch(t.suites, t.chars)
        return density_ratio(calibration, traffic, suites, max_weight=self.max_weight)


def traffic_sample_of(frame: Any, source: str = "") -> TrafficSample:
    """The unlabelled traffic in a frame of logged decisions (`routeopt.evals.storage.traffic`) or of
    prompts (columns `prompt` or `text`, optional `suite`): the requests whose text was kept,
    if any were; else a sketch of all of them (suites and lengths)."""
    if len(frame) == 0:
        raise ValueError(f"{source or 'the traffic sample'}: no requests")
    column = "prompt" if "prompt" in frame else "text" if "text" in frame else None
    suites = [
        s if isinstance(s, str) else None
        for s in (frame["suite"] if "suite" in frame else [None] * len(frame))
    ]
    if column is not None:
        texts = frame[column].tolist()
        kept = [i for i, t in enumerate(texts) if isinstance(t, str)]
        if kept:
            return TrafficSample.of_prompts(
                [texts[i] for i in kept], [suites[i] for i in kept], source=f"{source}: {len(kept)} prompts"
            )
    if "prompt_chars" not in frame:
        raise ValueError(f"{source or 'the traffic sample'}: neither prompt text nor prompt lengths")
    chars = np.nan_to_num(frame["prompt_chars"].to_numpy(dtype=np.float64), nan=0.0)
    return TrafficSample(
        suites, chars, source=f"{source}: {len(frame)} logged requests without text (suites and lengths)"
    )
