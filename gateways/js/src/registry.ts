/**
 * The gateway's loader: a registry URL polled with ETags (or a version's files given as
 * bytes), every check of section 10, the conformance self-check of section 9, and a hot swap
 * that never replaces the last good policy with a worse one.
 *
 * Only `fetch` and WebCrypto are used, so this runs in Node and in workers alike. Failures
 * after the first load are recorded (status(), onEvent) and never thrown into routing.
 */

import { checkVectors, ConformanceReport, summary } from "./conformance.js";
import { FormatError } from "./container.js";
import { budgetModel, LatencyKind, requestedBudget } from "./latency.js";
import { LiveLatency, liveMove, LiveMove, LiveSettings, liveSettings, Observation, observation } from "./live.js";
import { BudgetOutcome, Policy, READABLE_VERSIONS, readPolicy, VECTORS } from "./policy.js";
import { attributesFor, clock, recordDecision, TracingOptions, UNTRACED } from "./tracing.js";
import {
  checkChannel, checkOrder, FailureKind, importPublicKey, Manifest, MANIFEST, parseManifest, parsePointer, Pointer,
  Seen, sha256Hex, SIGNATURE, TrustedKey, VerificationError, verifySignature, canonicalJson, versionDir,
} from "./verification.js";

export const MAX_OBJECT_BYTES = 256 * 2 ** 20;

/** Where the newest accepted channel move is kept across restarts (a worker: KV, Durable Object...). */
export interface StateStore {
  get(): Seen | null | Promise<Seen | null>;
  set(seen: Seen): void | Promise<void>;
}

export interface RouterOptions extends TracingOptions {
  /** a registry's base URL (http(s)://host/prefix) or a version's URL (.../versions/000007-<sha12>) */
  url?: string;
  /** a version's files as bytes (manifest.json, manifest.sig and the policy's files), instead of a URL */
  files?: Record<string, Uint8Array>;
  /** trusted Ed25519 public keys (PEM); without any, loading fails unless allowUnsigned */
  publicKeys?: (string | Uint8Array)[];
  allowUnsigned?: boolean;
  /** default: champion if the registry has one, else latest */
  channel?: string;
  /** serve this model, saying why, while no valid policy is there (instead of failing to start) */
  defaultModel?: string;
  /** poll every refreshS seconds */
  refreshS?: number;
  /** how long one open, or one refresh, may take in all, every fetch it makes together (default 10000) */
  timeoutMs?: number;
  fetch?: typeof fetch;
  onEvent?: (kind: string, message: string) => void;
  state?: StateStore;
  now?: () => number;
  /** live latency (8.4): how much of the observations to remember and when a candidate is slow
   * (default: 30 s, 256 per candidate and kind, a figure from 20 on, slow past a live factor of
   * 1.5); null: budgets use the policy's predictions only */
  live?: Partial<LiveSettings> | null;
  /** the clock observations and decisions are stamped with, in seconds, never decreasing
   * (default: performance.now() / 1000) */
  clock?: () => number;
}

export interface Decision {
  model: string;
  fallbacks: string[];
  passProbabilities: Record<string, number>;
  expectedCostUsd: Record<string, number>;
  /** the probability that this request, given its id and contents, is served `model`: 1 unless a
   * Gateway's exploration could have sent it elsewhere (the policy's mixing draw is a hash of the request) */
  propensity: number;
  /** the policy's own probability for the model it chose: below 1 at a knob point mixing two rules */
  policyProbability: number;
  /** the request named a suite the policy was not trained on (it routed on the prompt alone) */
  unknownSuite: boolean;
  policyVersion: number;
  /** the id the decision is logged under (the request id given, else a generated one) */
  decisionId: string;
  defaultReason: string | null;
  /** the header to send on with the model call: names the decision's span, else the caller's own valid header */
  traceparent: string | null;
  /** the trace the decision belongs to (32 hex), also on the decision's log line */
  traceId: string | null;
  /** with a latency budget (8.3): its kind, budgetS, the certified tierS that served it (null
   * below every tier), whether the model's predicted p95 met it, each candidate's predictedS
   * (pass the called model's back with its observation), and the tier's maskS (null with none) */
  budget: BudgetOutcome | UnservedBudget | null;
  /** when live latency moved a decision under a budget (8.4): the policy's own model, and the
   * candidates slow enough live to be predicted past the tier's mask (in candidate order) */
  live: LiveMove | null;
}

/** A budget the serving policy cannot serve (it has no model of that kind, or no policy
 * serves): the decision is made without it, and says so (Python's Router does the same). */
export interface UnservedBudget {
  kind: LatencyKind;
  budgetS: number;
  met: null;
  unserved: string;
}

export interface RouteOptions {
  suite?: string | null;
  requestId?: string;
  qualityTarget?: number | null;
  /** a time-to-first-token budget in seconds (the p95 a candidate is predicted to keep; 8.3) */
  ttftBudgetS?: number | null;
  /** an end-to-end latency budget in seconds (not with ttftBudgetS); naming neither, a request
   * gets the policy's default budget for its suite where it has one (latency.defaults) */
  latencyBudgetS?: number | null;
  /** the caller's W3C traceparent header: the decision's span becomes its child */
  traceparent?: string | null;
}

export interface RouterStatus {
  source: string;
  channel: string | null;
  version: number;
  digest: string;
  signed: boolean;
  expiresAt: string | null;
  expired: boolean;
  lastError: string | null;
  consecutiveFailures: number;
  checks: number;
  swaps: number;
  servingDefault: boolean;
  defaultModel: string | null;
  defaultReason: string | null;
  conformance: string | null;
  /** requests naming a suite the serving policy was not trained on, by name (the first 100 names) */
  unknownSuites: Record<string, number>;
  /** every such request */
  unknownSuiteRequests: number;
}

/** Unknown suite names counted one by one; a client sending random names costs no more. */
export const MAX_UNKNOWN_SUITE_NAMES = 100;

interface Active {
  policy: Policy;
  version: number;
  digest: string;
  signed: boolean;
  manifest: Manifest;
  conformance: string;
}

/** Reads registry keys: over HTTP(S) with a size cap, or from given bytes. Every fetch of one
 * open or one refresh shares one deadline (`within`), so a registry that never answers fails
 * that open after timeoutMs in all, however many keys it took. */
class Source {
  private deadline: AbortController | null = null;

  constructor(readonly location: string, private readonly files: Record<string, Uint8Array> | null,
    private readonly fetchFn: typeof fetch, readonly timeoutMs: number) {}

  /** Run `fn` with one deadline of timeoutMs for every fetch it makes. */
  async within<T>(fn: () => Promise<T>): Promise<T> {
    if (this.files || this.deadline) return fn();
    const deadline = new AbortController();
    const timer = setTimeout(() => deadline.abort(), this.timeoutMs);
    this.deadline = deadline;
    try {
      return await fn();
    } finally {
      clearTimeout(timer);
      this.deadline = null;
    }
  }

  async get(key: string, etag?: string | null): Promise<{ data: Uint8Array<ArrayBuffer>; etag: string } | null> {
    if (this.files) {
      const data = this.files[key.split("/").pop()!];
      if (!data) throw new VerificationError(`${this.location}: ${key} is missing`);
      return { data: new Uint8Array(data), etag: "" };
    }
    if (!this.deadline) return this.within(() => this.get(key, etag));
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.fetchOnce(key, this.deadline.signal, etag);
      } catch (e) {
        // a connection dropped mid-answer (a pooled one the server had closed): GET again, twice at most
        if (!(e instanceof VerificationError && e.kind === "unreachable" && /connection|reset|closed|lost/i.test(e.message)) || attempt === 3) throw e;
      }
    }
  }

  private async fetchOnce(key: string, signal: AbortSignal, etag?: string | null): Promise<{ data: Uint8Array<ArrayBuffer>; etag: string } | null> {
    const url = this.location.replace(/\/+$/, "") + "/" + key.split("/").map(encodeURIComponent).join("/");
    try {
      // raced against the deadline too: a caller's fetch may ignore the signal
      return await untilAborted(this.fetchAndRead(url, signal, etag), signal);
    } catch (e) {
      if (e instanceof VerificationError) throw e;
      const why = signal.aborted ? `no answer within ${this.timeoutMs} ms` : (e as Error).message;
      throw new VerificationError(`${url}: registry unreachable (${why})`, "unreachable");
    }
  }

  private async fetchAndRead(url: string, signal: AbortSignal, etag?: string | null): Promise<{ data: Uint8Array<ArrayBuffer>; etag: string } | null> {
    const res = await this.fetchFn(url, { headers: etag ? { "If-None-Match": etag } : {}, signal });
    if (res.status === 304) return null;
    if (res.status === 404) throw new VerificationError(`${url}: not found`, "unreachable");
    if (!res.ok) throw new VerificationError(`${url}: HTTP ${res.status}`, "unreachable");
    return { data: await readCapped(res, url), etag: res.headers.get("ETag") ?? "" };
  }
}

/** `work`, or a rejection as soon as `signal` aborts, whichever comes first. */
function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) {
    work.catch(() => {});
    return Promise.reject(new Error("aborted"));
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(new Error("aborted"));
    signal.addEventListener("abort", onAbort, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

async function readCapped(res: Response, url: string): Promise<Uint8Array<ArrayBuffer>> {
  const declared = Number(res.headers.get("Content-Length") ?? "0");
  if (declared > MAX_OBJECT_BYTES) throw new VerificationError(`${url}: larger than ${MAX_OBJECT_BYTES} bytes; refusing it`);
  if (!res.body) return new Uint8Array(await res.arrayBuffer());
  const reader = res.body.getReader();
  const parts: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.length;
    if (size > MAX_OBJECT_BYTES) {
      await reader.cancel();
      throw new VerificationError(`${url}: larger than ${MAX_OBJECT_BYTES} bytes; refusing it`);
    }
    parts.push(value);
  }
  const out = new Uint8Array(size);
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
}

export class PolicyLoadError extends Error {
  override name = "PolicyLoadError";
  constructor(message: string, readonly kind: FailureKind) {
    super(message);
  }
}

const UNTRACED_DECISION = { traceparent: UNTRACED.traceparent, traceId: UNTRACED.traceId };
/** the fields Router.observe takes (8.4), and how its errors name the call */
const OBSERVATION_FIELDS: readonly string[] = ["ttftS", "latencyS", "predictedTtftS", "predictedLatencyS", "at"];
const OBSERVE = "observe(model, { ttftS, latencyS, predictedTtftS, predictedLatencyS, at })";

let idCounter = 0;
let idPrefix = ""; // drawn on first use: a worker may not draw random values at load time

/** A request id for callers that give none: `<12 random hex>-<counter in hex>`. */
export function newRequestId(): string {
  if (!idPrefix) idPrefix = Array.from(crypto.getRandomValues(new Uint8Array(6)), (b) => b.toString(16).padStart(2, "0")).join("") + "-";
  return idPrefix + (++idCounter).toString(16);
}

export class Router {
  private active: Active | null = null;
  private seen: Seen | null = null;
  private etag: string | null = null;
  private lastError: string | null = null;
  private failures = 0;
  private checks = 0;
  private swaps = 0;
  private defaultReason: string | null = null;
  private readonly unknownSuites = new Map<string, number>();
  private unknownTotal = 0;
  private readonly warnedBudgets = new Set<string>();
  private timer: ReturnType<typeof setInterval> | null = null;
  private busy: Promise<boolean> | null = null;
  /** what this gateway sees of each candidate's latency now (null: budgets use predictions only) */
  readonly live: LiveLatency | null;
  private readonly liveClock: () => number;

  private constructor(private readonly source: Source, private readonly prefix: string, readonly channel: string | null,
    private readonly keys: TrustedKey[] | null, private readonly opts: RouterOptions) {
    this.live = opts.live === null ? null : new LiveLatency(liveSettings(opts.live));
    this.liveClock = opts.clock ?? (() => performance.now() / 1000);
  }

  /** Load and verify a policy from a registry URL or from bytes; see RouterOptions. */
  static async open(opts: RouterOptions): Promise<Router> {
    if (opts.live !== null) liveSettings(opts.live);  // a bad setting fails before any fetch
    const keys = opts.publicKeys?.length ? await Promise.all(opts.publicKeys.map(importPublicKey)) : null;
    if (!keys && !opts.allowUnsigned) {
      throw new PolicyLoadError("no public key to verify policies with: pass publicKeys (PEM), or allowUnsigned: true to accept unsigned policies", "config");
    }
    const fetchFn = opts.fetch ?? globalThis.fetch.bind(globalThis);
    let source: Source, prefix = "";
    if (opts.files) {
      source = new Source("files", opts.files, fetchFn, 0);
    } else if (opts.url) {
      const m = /^(.*?)\/?(versions\/\d{6,}-[0-9a-f]{12})\/?$/.exec(opts.url);
      source = new Source(m ? m[1] : opts.url, null, fetchFn, opts.timeoutMs ?? 10000);
      prefix = m ? m[2] : "";
    } else {
      throw new PolicyLoadError("give url (a registry or version URL) or files (a version's bytes)", "config");
    }
    // one deadline for the whole open: finding the channel, the pointer and every file of the version
    const router = await source.within(async () => {
      const channel = opts.url && !prefix ? (opts.channel ? checkChannel(opts.channel) : await defaultChannel(source)) : null;
      const router = new Router(source, prefix, channel, keys, opts);
      await router.start0();
      return router;
    });
    if (opts.refreshS) router.start(opts.refreshS);
    return router;
  }

  private async start0(): Promise<void> {
    try {
      if (this.channel && this.opts.state) this.seen = (await this.opts.state.get()) ?? null;
      this.active = await this.initial();
    } catch (e) {
      const err = e instanceof VerificationError ? e : new VerificationError(String((e as Error).message ?? e));
      if (!this.opts.defaultModel) throw new PolicyLoadError(`cannot load a policy: ${err.message}`, err.kind);
      this.failures = 1;
      this.lastError = err.message;
      this.defaultReason = `no valid policy: ${err.message}`;
      this.emit("default", `serving the default model ${this.opts.defaultModel}: ${this.defaultReason}`);
    }
  }

  private now(): number {
    return this.opts.now ? this.opts.now() : Date.now();
  }

  /** Route one request with the current policy, or the default model while there is none.
   * With a tracer the decision is a span, a child of `opts.traceparent`, and
   * `decision.traceparent` names it; without one the caller's valid header comes back. */
  route(prompt: string, opts: RouteOptions = {}): Decision {
    if (!this.opts.tracer && !opts.traceparent) return this.decide(prompt, opts);
    const start = clock();
    const d = this.decide(prompt, opts);
    const traced = recordDecision(this.opts, opts.traceparent, start, attributesFor({
      ...d, requestId: opts.requestId, knobTarget: this.knobTarget(d, opts.qualityTarget), suite: opts.suite,
    }), (e) => this.emit("tracing", `the decision span was not recorded: ${(e as Error)?.message ?? e}`));
    return { ...d, traceparent: traced.traceparent, traceId: traced.traceId };
  }

  /** The decision alone, never traced (a Gateway records the span itself). */
  decide(prompt: string, opts: RouteOptions = {}): Decision {
    const id = opts.requestId ?? newRequestId();
    const a = this.active;
    const why = this.whyDefault(a);
    const asked = requestedBudget(opts.ttftBudgetS, opts.latencyBudgetS);
    if (!a || why) {
      if (typeof prompt !== "string") throw new TypeError(`prompt must be a string, got ${typeof prompt}`);
      return { model: this.opts.defaultModel!, fallbacks: [], passProbabilities: {}, expectedCostUsd: {}, propensity: 1,
        policyProbability: 1, unknownSuite: false, policyVersion: 0, decisionId: id, defaultReason: why, ...UNTRACED_DECISION,
        budget: asked && { ...asked, met: null, unserved: "no policy" }, live: null };
    }
    let unserved: UnservedBudget | null = null;
    if (asked && !budgetModel(a.policy.latency, asked.kind)) {
      unserved = { ...asked, met: null, unserved: `policy version ${a.version} has no ${asked.kind} model` };
      const key = `budget-${asked.kind}-${a.version}`;
      if (!this.warnedBudgets.has(key)) {
        this.warnedBudgets.add(key);
        this.emit("budget", `${unserved.unserved}: deciding without the budget`);
      }
    }
    // a request naming no budget gets the policy's default for its suite; one it names wins
    const d = a.policy.choose(prompt, opts.suite, opts.qualityTarget,
      unserved ? {} : { ttftBudgetS: opts.ttftBudgetS, latencyBudgetS: opts.latencyBudgetS, useDefaults: true });
    const names = a.policy.candidates;
    const p: Record<string, number> = {}, c: Record<string, number> = {};
    for (let j = 0; j < names.length; j++) {
      p[names[j]] = d.p[j];
      c[names[j]] = d.c[j];
    }
    const unknownSuite = Boolean(opts.suite) && !a.policy.spec.suiteIndex.has(opts.suite!);
    if (unknownSuite) this.unknownSuite(opts.suite!, a.policy.spec.suites);
    const decided = { model: d.model, fallbacks: d.fallbacks, budget: unserved ?? d.budget, live: null };
    return { ...decided, ...(d.budget && this.live ? this.moved(d.model, d.fallbacks, p, d.budget, names) : {}),
      passProbabilities: p, expectedCostUsd: c, propensity: 1, policyProbability: d.propensity, unknownSuite,
      policyVersion: a.version, decisionId: id, defaultReason: null, traceparent: UNTRACED.traceparent, traceId: UNTRACED.traceId };
  }

  /** 8.4: a decision under a budget whose model is over live (slow, and its prediction slowed by
   * its factor past the tier's mask, or the budget with no tier), moved where liveMove says;
   * nothing when it stays. */
  private moved(model: string, fallbacks: string[], p: Record<string, number>, budget: BudgetOutcome,
    names: readonly string[]): Partial<Decision> {
    const now = this.liveClock(), limitS = budget.maskS ?? budget.budgetS;
    // the common case: the chosen model's factor alone (one sort); every candidate's only when it is over
    const f = this.live!.slow([model], budget.kind, now).get(model);
    if (f === undefined || budget.predictedS[model] * f <= limitS) return {};
    const move = liveMove(model, fallbacks, names, p, budget.predictedS, limitS, this.live!.slow(names, budget.kind, now));
    if (!move) return {};
    return { model: move.model, fallbacks: move.fallbacks, live: { from: model, over: move.over },
      budget: { ...budget, met: budget.predictedS[move.model] <= budget.budgetS } };
  }

  /** One call of `model` as the application measured it (TTFT and end-to-end seconds), each with
   * the p95 the decision predicted for it where there was one (its `budget.predictedS[model]`,
   * of the budget's kind): decisions under a budget move off a candidate whose calls run slower
   * than predicted (8.4). `at` defaults to the router's clock. A value that is not a
   * non-negative finite number, a prediction that is not a positive one, or a prediction
   * without its measurement is an error. */
  observe(model: string, obs: Observation): void {
    if (typeof obs !== "object" || obs === null) throw new TypeError(`${OBSERVE}: the observation must be an object`);
    const extra = Object.keys(obs).filter((k) => !OBSERVATION_FIELDS.includes(k));
    if (extra.length) throw new TypeError(`${OBSERVE}: unknown field ${JSON.stringify(extra[0])}`);
    if ((obs.ttftS ?? null) === null && (obs.latencyS ?? null) === null) {
      throw new TypeError(`${OBSERVE}: give ttftS or latencyS (seconds), or both`);
    }
    const at = obs.at ?? this.liveClock();
    if (this.live) this.live.observe(model, at, obs.ttftS, obs.latencyS, obs.predictedTtftS, obs.predictedLatencyS);
    else observation(model, at, obs.ttftS, obs.latencyS, obs.predictedTtftS, obs.predictedLatencyS);  // checked all the same
  }

  /** Count a request naming a suite the policy does not know, and warn (onEvent) once per name. */
  private unknownSuite(suite: string, known: string[]): void {
    this.unknownTotal++;
    const n = this.unknownSuites.get(suite);
    if (n !== undefined) {
      this.unknownSuites.set(suite, n + 1);
      return;
    }
    if (this.unknownSuites.size >= MAX_UNKNOWN_SUITE_NAMES) return;
    this.unknownSuites.set(suite, 1);
    let message = `suite ${JSON.stringify(suite)} is not one the policy was trained on (it knows ${JSON.stringify([...known].sort())}); `
      + "such requests route on the prompt alone";
    if (this.unknownSuites.size === MAX_UNKNOWN_SUITE_NAMES) {
      message += `; ${MAX_UNKNOWN_SUITE_NAMES} unknown suite names seen, later ones are counted, not named`;
    }
    this.emit("unknown_suite", message);
  }

  /** The quality target a decision used: the caller's, else the policy's own (none for the default model). */
  knobTarget(d: Decision, qualityTarget: number | null | undefined): number | null {
    return qualityTarget ?? (d.defaultReason === null ? this.active?.policy.qualityTarget ?? null : null);
  }

  /** The tracer decisions are recorded with (a Gateway uses it unless given its own). */
  get tracing(): TracingOptions {
    return { tracer: this.opts.tracer ?? null, contextFor: this.opts.contextFor ?? null };
  }

  get policy(): Policy | null {
    return this.active?.policy ?? null;
  }

  /** The version that routes requests; 0 while the default model does. */
  get version(): number {
    return this.whyDefault(this.active) ? 0 : this.active!.version;
  }

  private whyDefault(a: Active | null): string | null {
    if (!a) return this.defaultReason ?? "no policy";
    if (this.opts.defaultModel && a.manifest.expiresAt !== null && this.now() >= a.manifest.expiresAt) {
      return `version ${a.version} expired at ${a.manifest.expiresText}`;
    }
    return null;
  }

  private async initial(): Promise<Active> {
    if (!this.channel) return this.build(this.prefix);
    const got = await this.readPointer(null);
    this.checkOrder(got!.pointer);
    const active = await this.build(got!.pointer.path, got!.pointer.digest);
    await this.accept(got!);
    return active;
  }

  private async readPointer(etag: string | null): Promise<{ pointer: Pointer; etag: string } | null> {
    const key = `channels/${this.channel}.json`;
    const where = `${this.source.location}: ${key}`;
    const got = await this.source.get(key, etag);
    if (!got) return null;
    let doc: { payload?: unknown; signature?: unknown };
    try {
      doc = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(got.data));
      if (typeof doc !== "object" || doc === null || !("payload" in doc)) throw new Error("no payload");
    } catch {
      throw new VerificationError(`${where}: not a valid channel file (truncated or corrupt)`);
    }
    if (this.keys) {
      if (!doc.signature) throw new VerificationError(`${where}: unsigned, and a public key was given`, "unsigned");
      await verifySignature(doc.signature, new TextEncoder().encode(canonicalJson(doc.payload)), this.keys, where);
    }
    const pointer = parsePointer(doc.payload, where);
    if (pointer.channel !== this.channel) throw new VerificationError(`${where}: pointer is for channel ${JSON.stringify(pointer.channel)} (copied?)`);
    return { pointer, etag: got.etag };
  }

  private checkOrder(p: Pointer): void {
    checkOrder(p, this.seen);
  }

  private async accept(got: { pointer: Pointer; etag: string }): Promise<void> {
    this.etag = got.etag;
    const p = got.pointer;
    if (!this.seen || p.seq > this.seen.seq) this.seen = { seq: p.seq, version: p.version, digest: p.digest };
    try {
      await this.opts.state?.set(this.seen);
    } catch (e) {
      this.emit("state", `cannot record the accepted move: ${(e as Error).message}`);
    }
  }

  /** Read and check one version, load it, run its conformance vectors and one trial decision. */
  private async build(prefix: string, expectedDigest?: string): Promise<Active> {
    const key = (name: string) => (prefix ? `${prefix}/${name}` : name);
    const where = `${this.source.location}: ${key(MANIFEST)}`;
    const manifestBytes = (await this.source.get(key(MANIFEST)))!.data;
    const digest = await sha256Hex(manifestBytes);
    if (expectedDigest && digest !== expectedDigest) {
      throw new VerificationError(`${where}: sha256 ${digest.slice(0, 12)} does not match the channel's ${expectedDigest.slice(0, 12)} (tampered or replaced)`);
    }
    const signed = await this.checkManifestSignature(key(SIGNATURE), manifestBytes, where);
    const manifest = parseManifest(manifestBytes, where);
    const dir = /(\d{6,})-([0-9a-f]{12})$/.exec(prefix);
    if (dir && (Number(dir[1]) !== manifest.version || dir[2] !== digest.slice(0, 12) || prefix !== versionDir(manifest.version, digest))) {
      throw new VerificationError(`${where}: folder name says version ${Number(dir[1])} / ${dir[2]} but the manifest is version ${manifest.version} / ${digest.slice(0, 12)} (moved or tampered)`);
    }
    if (manifest.expiresAt !== null && this.now() >= manifest.expiresAt) {
      throw new VerificationError(`${where}: version ${manifest.version} expired at ${manifest.expiresText}; publish a fresh policy`, "expired");
    }
    const pf = manifest.policyFormat;
    if (!READABLE_VERSIONS.includes(pf.version as number)) {
      throw new VerificationError(`${where}: policy format ${JSON.stringify(pf.version ?? 2)} is not supported by this runtime (reads ${READABLE_VERSIONS.join(" and ")}; publish the policy again with a current routeopt)`);
    }
    if (pf.portable === false) throw new VerificationError(`${where}: not portable: ${pf.not_portable ?? "the manifest says so"}`);
    const files: Record<string, Uint8Array> = {};
    for (const f of manifest.files) {
      const blob = (await this.source.get(key(f.path)))!.data;
      if (blob.length !== f.size || (await sha256Hex(blob)) !== f.sha256) {
        throw new VerificationError(`${this.source.location}: ${key(f.path)}: size or sha256 does not match manifest.json (tampered or truncated)`);
      }
      files[f.path] = blob;
    }
    const loaded = await this.load(files, where);
    if (loaded.policy.formatVersion !== pf.version) {
      throw new VerificationError(`${where}: policy_format.version ${pf.version} but policy.json's format_version is ${loaded.policy.formatVersion} (tampered or mixed files)`);
    }
    const active = { ...loaded, version: manifest.version, digest, signed, manifest };
    return active;
  }

  private async checkManifestSignature(sigKey: string, data: Uint8Array<ArrayBuffer>, where: string): Promise<boolean> {
    let raw: Uint8Array;
    try {
      raw = (await this.source.get(sigKey))!.data;
    } catch (e) {
      if (e instanceof VerificationError && /not found|missing/.test(e.message)) {
        if (this.keys) throw new VerificationError(`${this.source.location}: ${sigKey}: missing, and a public key was given (unsigned policy)`, "unsigned");
        return false;
      }
      throw e;
    }
    if (!this.keys) return false;
    let sig: unknown;
    try {
      sig = JSON.parse(new TextDecoder().decode(raw));
    } catch {
      throw new VerificationError(`${this.source.location}: ${sigKey}: not valid JSON`);
    }
    await verifySignature(sig, data, this.keys, where);
    return true;
  }

  private async load(files: Record<string, Uint8Array>, where: string): Promise<{ policy: Policy; conformance: string }> {
    let policy: Policy;
    let report: ConformanceReport;
    try {
      if (!files["policy.json"] || !files["arrays.safetensors"]) throw new FormatError("policy.json or arrays.safetensors is not among the files");
      policy = readPolicy(files["policy.json"], files["arrays.safetensors"]);
      if (!files[VECTORS]) throw new FormatError(`${VECTORS} is missing; a format 3 policy ships its conformance vectors`);
      report = await checkVectors(policy, files[VECTORS]);
    } catch (e) {
      throw new VerificationError(`${where}: policy does not load or decide: ${(e as Error).message}`);
    }
    if (!report.ok) throw new VerificationError(`${where}: this runtime refuses the policy: ${summary(report)}`, "conformance");
    const trial = policy.decide("routeopt load check: 2 + 2 = ?");
    if (!policy.candidates.includes(trial.model)) throw new VerificationError(`${where}: chose ${trial.model}, which is not a candidate`);
    return { policy, conformance: summary(report) };
  }

  /** Poll once, within one timeoutMs for all its fetches; true if a new policy was swapped in.
   * Failures are recorded, never thrown. */
  refresh(): Promise<boolean> {
    if (!this.busy) this.busy = this.refresh0().finally(() => { this.busy = null; });
    return this.busy;
  }

  private async refresh0(): Promise<boolean> {
    this.checks++;
    try {
      const next = await this.source.within(() => this.poll());
      this.failures = 0;
      this.lastError = null;
      if (!next) return false;
      this.swaps++;
      this.defaultReason = null;
      this.active = next;
      this.emit("swapped", `version ${next.version}`);
      return true;
    } catch (e) {
      const err = e instanceof VerificationError ? e : new VerificationError(String((e as Error)?.message ?? e));
      this.failures++;
      this.lastError = err.message;
      this.emit(err.kind === "unreachable" ? "unreachable" : "rejected", err.message);
      return false;
    }
  }

  private async poll(): Promise<Active | null> {
    if (!this.channel) return this.active ? null : this.initial();
    const got = await this.readPointer(this.etag);
    if (!got) return null;
    const p = got.pointer, current = this.active;
    this.checkOrder(p);
    if (current && p.version === current.version) {
      if (p.digest !== current.digest) {
        throw new VerificationError(`channel ${this.channel}: version ${p.version} now has digest ${p.digest.slice(0, 12)}, served ${current.digest.slice(0, 12)} (rewritten)`);
      }
      await this.accept(got);
      return null;
    }
    const next = await this.build(p.path, p.digest);
    await this.accept(got);
    return next;
  }

  /** Poll every intervalS seconds until close(). */
  start(intervalS: number): this {
    if (!this.timer) {
      this.timer = setInterval(() => void this.refresh(), intervalS * 1000);
      (this.timer as { unref?: () => void }).unref?.();
    }
    return this;
  }

  close(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  status(): RouterStatus {
    const a = this.active, why = this.whyDefault(a), held = Boolean(a) && !why;
    return {
      source: this.source.location, channel: this.channel, version: held ? a!.version : 0, digest: held ? a!.digest : "",
      signed: held && a!.signed, expiresAt: a?.manifest.expiresText ?? null,
      expired: Boolean(a && a.manifest.expiresAt !== null && this.now() >= a.manifest.expiresAt),
      lastError: this.lastError, consecutiveFailures: this.failures, checks: this.checks, swaps: this.swaps,
      servingDefault: why !== null, defaultModel: this.opts.defaultModel ?? null, defaultReason: why,
      conformance: a?.conformance ?? null, unknownSuites: Object.fromEntries(this.unknownSuites),
      unknownSuiteRequests: this.unknownTotal,
    };
  }

  private emit(kind: string, message: string): void {
    try {
      this.opts.onEvent?.(kind, message);
    } catch {
      // a broken callback must not stop the refresher
    }
  }
}

/** champion if the registry has one, else latest if it has that, else champion. */
async function defaultChannel(source: Source): Promise<string> {
  for (const c of ["champion", "latest"]) {
    try {
      if (await source.get(`channels/${c}.json`)) return c;
    } catch (e) {
      if (!(e instanceof VerificationError && e.kind === "unreachable" && /not found/.test(e.message))) {
        if (e instanceof VerificationError && e.kind === "unreachable") return "champion";
        throw e;
      }
    }
  }
  return "champion";
}
