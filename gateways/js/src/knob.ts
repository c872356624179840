/**
 * Section 7, "Knob": members, operating points, the point that serves a target, and the
 * request's mixing draw.
 */

import { Blake2b, unitAt } from "./blake2b.js";
import { ByteScratch } from "./bytes.js";
import { FormatError } from "./container.js";

export type Rule = "lambda" | "single" | "threshold";
export interface Member { rule: Rule; param: number }
export interface Point { a: number; b: number; weight: number; certified: number }
export interface Knob { members: Member[]; points: Point[]; top: Point }

function num(v: unknown, where: string, nullAs?: number): number {
  if (v === null && nullAs !== undefined) return nullAs;
  if (typeof v !== "number" || !Number.isFinite(v)) throw new FormatError(`${where}: expected a number, got ${JSON.stringify(v)}`);
  return v;
}

function point(v: unknown, nMembers: number, where: string): Point {
  if (!Array.isArray(v) || v.length !== 6) throw new FormatError(`${where}: a point is [a, b, weight, certified, pass_rate, cost]`);
  const [a, b] = [num(v[0], where), num(v[1], where)];
  if (!Number.isInteger(a) || !Number.isInteger(b) || a < 0 || b < 0 || a >= nMembers || b >= nMembers) {
    throw new FormatError(`${where}: an operating point names member ${Math.max(a, b)}; there are ${nMembers}`);
  }
  return { a, b, weight: num(v[2], where), certified: num(v[3], where, -Infinity) };
}

/** policy.json's knob (or a latency tier's, `name` saying which), checked: known rules,
 * members in range, strictly rising certificates. */
export function parseKnob(raw: unknown, k: number, name = "knob"): Knob {
  const at = `policy.json: ${name}`;
  const d = raw as { members?: unknown; points?: unknown; top?: unknown };
  if (typeof d !== "object" || d === null || !Array.isArray(d.members) || !Array.isArray(d.points)) {
    throw new FormatError(`${at} must have members and points`);
  }
  const members = d.members.map((m, i): Member => {
    if (!Array.isArray(m) || m.length !== 2 || !["lambda", "single", "threshold"].includes(m[0])) {
      throw new FormatError(`${at}.members[${i}]: unknown knob member rule ${JSON.stringify(Array.isArray(m) ? m[0] : m)}; this runtime reads lambda, single, threshold`);
    }
    const param = num(m[1], `${at}.members[${i}]`);
    if (m[0] === "single" && !(Number.isInteger(param) && param >= 0 && param < k)) {
      throw new FormatError(`${at} member names candidate ${param}; the policy has ${k}`);
    }
    return { rule: m[0] as Rule, param };
  });
  const points = d.points.map((p, i) => point(p, members.length, `${at}.points[${i}]`));
  for (let i = 1; i < points.length; i++) {
    if (!(points[i].certified > points[i - 1].certified)) throw new FormatError(`${at} points must have strictly rising certified targets`);
  }
  return { members, points, top: point(d.top, members.length, `${at}.top`) };
}

/** The first point certified for x - 1e-12, else the top. */
export function pointFor(knob: Knob, target: number): Point {
  const t = target - 1e-12;
  for (const p of knob.points) if (p.certified >= t) return p;
  return knob.top;
}

/** The candidate a member chooses for (p, c); with `allowed` (8.3: a latency budget's mask,
 * at least one candidate allowed) among the allowed candidates only. */
export function memberChoice(m: Member, p: Float64Array, c: Float64Array, allowed: Uint8Array | null = null): number {
  const k = p.length;
  if (m.rule === "single") return allowed === null || allowed[m.param] ? m.param : memberChoice(LAMBDA0, p, c, allowed);
  if (m.rule === "lambda") {
    let best = -Infinity;
    for (let j = 0; j < k; j++) {
      if (allowed !== null && !allowed[j]) continue;
      const s = p[j] - m.param * c[j];
      if (s > best) best = s;
    }
    let pick = -1;
    for (let j = 0; j < k; j++) {
      if (allowed !== null && !allowed[j]) continue;
      if (p[j] - m.param * c[j] >= best && (pick < 0 || c[j] < c[pick])) pick = j;
    }
    return pick;
  }
  // threshold: by (allowed first, cost if p >= tau else +inf, 0 if p >= tau else -p, cost, index)
  const out = (j: number) => (allowed !== null && !allowed[j] ? 1 : 0);
  const key = (j: number) => (p[j] >= m.param ? c[j] : Infinity);
  const second = (j: number) => (p[j] >= m.param ? 0 : -p[j]);
  let pick = 0;
  for (let j = 1; j < k; j++) {
    const oj = out(j), op = out(pick), kj = key(j), kp = key(pick), sj = second(j), sp = second(pick);
    if (oj < op || (oj === op && (kj < kp || (kj === kp && (sj < sp || (sj === sp && c[j] < c[pick])))))) pick = j;
  }
  return pick;
}

const LAMBDA0: Member = { rule: "lambda", param: 0 };

const hasher = new Blake2b();
const suiteBytes = new ByteScratch(256);
const ZERO = new Uint8Array(1);

/** 7: BLAKE2b-64 of the suite's bytes, 0x00 and the prompt's cut bytes, as a number in [0, 1]. */
export function mixingDraw(cut: Uint8Array, suite: string | null | undefined): number {
  hasher.start(8).update(suiteBytes.encode(suite || "")).update(ZERO).update(cut);
  return unitAt(hasher.finish(), 0);
}
