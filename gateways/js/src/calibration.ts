/**
 * Section 6, "Calibration and cost": Platt scaling of the logits, and the cost model.
 */

import { sigmoid } from "./numbers.js";

export interface CostArrays {
  coef: Float64Array; // (2 + S, K)
  floor: Float64Array; // (K,)
  topicCoef: Float64Array | null; // (G, K)
}

/** p_k = sigmoid(platt[0][k] * z_k + platt[1][k]). */
export function calibrate(platt: Float64Array, z: Float64Array, p: Float64Array): void {
  const k = z.length;
  for (let j = 0; j < k; j++) p[j] = sigmoid(platt[j] * z[j] + platt[k + j]);
}

/** c_k = coef[0] + (n_chars / 1000) * coef[1] (+ suite offset) (+ topic offset), floored. */
export function costs(m: CostArrays, nChars: number, suitePos: number, topic: number, c: Float64Array): void {
  const k = c.length;
  const kchars = nChars / 1000;
  for (let j = 0; j < k; j++) {
    let v = m.coef[j] + kchars * m.coef[k + j];
    if (suitePos >= 0) v = v + m.coef[(2 + suitePos) * k + j];
    if (m.topicCoef && topic >= 0) v = v + m.topicCoef[topic * k + j];
    c[j] = v < m.floor[j] ? m.floor[j] : v;
  }
}
