/**
 * Section 5, "Scorer": feature row -> one logit per candidate (and a topic).
 *
 * 5.1 `difficulty-linear`: ordered sums of value x weight over the row, then per-suite slopes
 * and, with topics, the nearest centroid's prior and slope. 5.2 `trees`: LightGBM boosters as
 * arrays, walked on the dense feature vector and summed in tree order.
 */

import { FormatError } from "./container.js";
import type { Kernel } from "./kernel.js";

export interface Scorer {
  /** Fills z (K logits) from the first n entries of a row and returns the topic (-1 without topics). */
  score(ids: Int32Array, vals: Float64Array, n: number, suitePos: number, z: Float64Array): number;
}

export interface LinearArrays {
  weights: Float32Array | Float64Array; // (F, C) row-major, C = K + 1 + R
  bias: Float64Array;
  difficultyBias: number;
  slopes: Float64Array; // (S + 1, K)
  centroids: Float64Array | null; // (G, R)
  topicBias: Float64Array | null;
  topicSlopes: Float64Array | null;
  topicDifficulty: Float64Array | null;
}

/** r[j] = the ordered sum over the row's first n entries of vals[e] * w[ids[e], j] (5.1), four
 * columns at a time so their partial sums stay in registers; each column is still summed in row
 * order. (Kernel.rowSums is this loop in WebAssembly.) */
export function rowSums(w: Float32Array | Float64Array, c: number, ids: Int32Array, vals: Float64Array, r: Float64Array,
  n = ids.length): void {
  if (n === 0) {
    r.fill(0);
    return;
  }
  const first = ids[0] * c, v0 = vals[0];
  let j = 0;
  for (; j + 4 <= c; j += 4) {
    let s0 = v0 * w[first + j], s1 = v0 * w[first + j + 1], s2 = v0 * w[first + j + 2], s3 = v0 * w[first + j + 3];
    for (let e = 1; e < n; e++) {
      const v = vals[e], row = ids[e] * c + j;
      s0 = s0 + v * w[row];
      s1 = s1 + v * w[row + 1];
      s2 = s2 + v * w[row + 2];
      s3 = s3 + v * w[row + 3];
    }
    r[j] = s0; r[j + 1] = s1; r[j + 2] = s2; r[j + 3] = s3;
  }
  for (; j < c; j++) {
    let s = v0 * w[first + j];
    for (let e = 1; e < n; e++) s = s + vals[e] * w[ids[e] * c + j];
    r[j] = s;
  }
}

export class LinearScorer implements Scorer {
  private readonly c: number;
  private readonly r: Float64Array;
  private readonly halfNorms: Float64Array;

  /** With a kernel (holding a copy of the weights), the row sums run in WebAssembly. */
  constructor(private readonly a: LinearArrays, private readonly k: number, private readonly nSuites: number,
    private readonly rank: number, private readonly topics: number, private readonly kernel: Kernel | null = null) {
    this.c = k + 1 + rank;
    this.r = kernel ? kernel.r : new Float64Array(this.c);
    this.halfNorms = new Float64Array(topics);
    for (let g = 0; g < topics; g++) {
      let s = 0;
      for (let i = 0; i < rank; i++) {
        const v = a.centroids![g * rank + i];
        s = i === 0 ? v * v : s + v * v;
      }
      this.halfNorms[g] = 0.5 * s;
    }
  }

  score(ids: Int32Array, vals: Float64Array, n: number, suitePos: number, z: Float64Array): number {
    const { a, c, k, r } = this;
    if (this.kernel) this.kernel.rowSums(ids, vals, n);
    else rowSums(a.weights, c, ids, vals, r, n);
    const sp = suitePos >= 0 ? suitePos : this.nSuites;
    let d = r[k] + a.difficultyBias;
    let g = -1;
    if (this.topics > 0) {
      g = this.topic();
      d = d + a.topicDifficulty![g];
    }
    for (let j = 0; j < k; j++) {
      let out = r[j] + a.bias[j];
      let slope = a.slopes[sp * k + j];
      if (g >= 0) {
        out = out + a.topicBias![g * k + j];
        slope = slope + a.topicSlopes![g * k + j];
      }
      z[j] = out + d * slope;
    }
    return g;
  }

  /** The first g maximising centroid_g . (zt / |zt|) - |centroid_g|^2 / 2. */
  private topic(): number {
    const { r, k, rank } = this;
    const cent = this.a.centroids!;
    let sq = 0;
    for (let i = 0; i < rank; i++) {
      const v = r[k + 1 + i];
      sq = i === 0 ? v * v : sq + v * v;
    }
    const norm = Math.sqrt(sq);
    let best = -1, bestSim = 0;
    for (let g = 0; g < this.topics; g++) {
      let s = 0;
      for (let i = 0; i < rank; i++) {
        const u = norm > 0 ? r[k + 1 + i] / norm : r[k + 1 + i];
        const t = cent[g * rank + i] * u;
        s = i === 0 ? t : s + t;
      }
      const sim = s - this.halfNorms[g];
      if (best < 0 || sim > bestSim) {
        best = g;
        bestSim = sim;
      }
    }
    return best;
  }
}

export interface Forest {
  feature: Int32Array;
  threshold: Float64Array;
  defaultLeft: Uint8Array;
  missing: Uint8Array;
  left: Int32Array;
  right: Int32Array;
  leafValue: Float64Array;
  nodeStart: Int32Array;
  leafStart: Int32Array;
  treeStart: Int32Array;
  constant: Float64Array;
  hasTrees: Uint8Array;
}

const ZERO = 1.0000000180025095e-35;

export class TreeScorer implements Scorer {
  private readonly x: Float64Array;

  constructor(private readonly f: Forest, private readonly k: number, nFeatures: number) {
    this.x = new Float64Array(nFeatures);
    checkForest(f, k, nFeatures);
  }

  score(ids: Int32Array, vals: Float64Array, n: number, _suitePos: number, z: Float64Array): number {
    const { f, x } = this;
    for (let e = 0; e < n; e++) x[ids[e]] = vals[e];
    for (let k = 0; k < this.k; k++) {
      if (!f.hasTrees[k]) {
        z[k] = f.constant[k];
        continue;
      }
      let raw = 0;
      for (let t = f.treeStart[k]; t < f.treeStart[k + 1]; t++) raw = raw + this.leaf(t);
      z[k] = raw;
    }
    for (let e = 0; e < n; e++) x[ids[e]] = 0;
    return -1;
  }

  private leaf(t: number): number {
    const { f, x } = this;
    const base = f.nodeStart[t];
    let node = f.nodeStart[t + 1] > base ? 0 : -1;
    while (node >= 0) {
      const at = base + node;
      let v = x[f.feature[at]];
      const missing = f.missing[at];
      const nan = Number.isNaN(v);
      if (nan && missing !== 2) v = 0;
      let left: boolean;
      if ((missing === 1 && v >= -ZERO && v <= ZERO) || (missing === 2 && nan)) left = f.defaultLeft[at] === 1;
      else left = v <= f.threshold[at];
      node = left ? f.left[at] : f.right[at];
    }
    return f.leafValue[f.leafStart[t] - node - 1];
  }
}

/** 5.2's rules: every walk must end at a leaf of its own tree. */
function checkForest(f: Forest, k: number, nFeatures: number): void {
  const nTrees = f.nodeStart.length - 1;
  const nNodes = f.feature.length;
  const bad = (why: string) => new FormatError(`arrays.safetensors: scorer.trees: ${why}`);
  if (f.treeStart.length !== k + 1 || f.treeStart[0] !== 0 || f.treeStart[k] !== nTrees) throw bad("tree_start does not cover the trees");
  if (f.nodeStart[0] !== 0 || f.nodeStart[nTrees] !== nNodes || f.leafStart[0] !== 0 || f.leafStart[nTrees] !== f.leafValue.length
      || f.leafStart.length !== nTrees + 1) throw bad("node or leaf offsets do not cover the arrays");
  for (const a of [f.threshold, f.defaultLeft, f.missing, f.left, f.right]) if (a.length !== nNodes) throw bad("per-node arrays differ in length");
  const nodeSeen = new Uint8Array(nNodes);
  const leafSeen = new Uint8Array(f.leafValue.length);
  for (let t = 0; t < nTrees; t++) {
    const n0 = f.nodeStart[t], n1 = f.nodeStart[t + 1], l0 = f.leafStart[t], l1 = f.leafStart[t + 1];
    const nodes = n1 - n0, leaves = l1 - l0;
    if (nodes < 0 || leaves !== nodes + 1) throw bad(`tree ${t} must have one leaf more than it has nodes`);
    if (nodes === 0) leafSeen[l0] = 1;
    for (let i = 0; i < nodes; i++) {
      if (f.feature[n0 + i] < 0 || f.feature[n0 + i] >= nFeatures) throw bad(`tree ${t} splits on a feature outside 0..${nFeatures - 1}`);
      for (const c of [f.left[n0 + i], f.right[n0 + i]]) {
        if (c >= 0) {
          if (c <= i || c >= nodes || nodeSeen[n0 + c]++) throw bad(`tree ${t}: a child points outside its tree, back up it, or twice`);
        } else if (-c - 1 >= leaves || leafSeen[l0 - c - 1]++) throw bad(`tree ${t}: a leaf is outside the tree or reached twice`);
      }
    }
    for (let i = 1; i < nodes; i++) if (!nodeSeen[n0 + i]) throw bad(`tree ${t}: node ${i} is never reached`);
    for (let i = 0; i < leaves; i++) if (!leafSeen[l0 + i]) throw bad(`tree ${t}: leaf ${i} is never reached`);
  }
}
