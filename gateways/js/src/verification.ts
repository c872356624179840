/**
 * Section 10, "Verification": channel pointers and their canonical JSON, manifests, Ed25519
 * signatures (WebCrypto), file hashes, expiry and the order rules that refuse replays and
 * downgrades.
 */

import { textBytes } from "./bytes.js";

export type FailureKind = "expired" | "unsigned" | "order" | "conformance" | "rejected" | "unreachable" | "config";

/** A policy that must not be served; `kind` lets callers act without parsing the message. */
export class VerificationError extends Error {
  override name = "VerificationError";
  constructor(message: string, readonly kind: FailureKind = "rejected") {
    super(message);
  }
}

export const MANIFEST = "manifest.json";
export const SIGNATURE = "manifest.sig";
const SAFE_PART = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/;
const VERSION_DIR = /^versions\/(\d{6,})-([0-9a-f]{12})$/;
const CHANNEL = /^[a-z][a-z0-9_-]{0,63}$/;
const HEX64 = /^[0-9a-f]{64}$/;
const TIME = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})Z$/;

export function hex(bytes: Uint8Array): string {
  let s = "";
  for (const b of bytes) s += b.toString(16).padStart(2, "0");
  return s;
}

export async function sha256Hex(data: Uint8Array<ArrayBuffer>): Promise<string> {
  return hex(new Uint8Array(await crypto.subtle.digest("SHA-256", data)));
}

/** The signed form of a pointer payload: sorted keys, no spaces, ASCII escapes, integers only. */
export function canonicalJson(v: unknown): string {
  if (v === null || typeof v === "boolean") return JSON.stringify(v);
  if (typeof v === "number") {
    if (!Number.isSafeInteger(v)) throw new VerificationError(`a signed pointer holds the number ${v}; only integers are allowed`);
    return String(v);
  }
  if (typeof v === "string") {
    return JSON.stringify(v).replace(/[\u0080-\uffff]/g, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
  }
  if (Array.isArray(v)) return "[" + v.map(canonicalJson).join(",") + "]";
  if (typeof v === "object") {
    const keys = Object.keys(v as object).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
    return "{" + keys.map((k) => canonicalJson(k) + ":" + canonicalJson((v as Record<string, unknown>)[k])).join(",") + "}";
  }
  throw new VerificationError(`a signed pointer holds a ${typeof v}`);
}

export function parseTime(v: unknown, where: string): number {
  const m = typeof v === "string" ? TIME.exec(v) : null;
  if (!m) throw new VerificationError(`${where}: ${JSON.stringify(v)} is not a timestamp like 2026-01-31T12:00:00Z`);
  const t = Date.UTC(+m[1], +m[2] - 1, +m[3], +m[4], +m[5], +m[6]);
  if (new Date(t).toISOString().slice(0, 19) + "Z" !== v) throw new VerificationError(`${where}: ${v} is not a valid date`);
  return t;
}

export function checkFileName(name: unknown, where: string): string {
  if (typeof name !== "string" || !name || name.length > 512 || !name.split("/").every((p) => SAFE_PART.test(p))) {
    throw new VerificationError(`${where}: unsafe file name ${JSON.stringify(name)} (path traversal or odd characters)`);
  }
  return name;
}

export interface FileEntry { path: string; sha256: string; size: number }
export interface PolicyFormat { version?: number; portable?: boolean; not_portable?: string | null; conformance?: string | null }
export interface Manifest {
  version: number;
  createdAt: number;
  expiresAt: number | null;
  expiresText: string | null;
  files: FileEntry[];
  policyFormat: PolicyFormat;
}

const positive = (v: unknown) => typeof v === "number" && Number.isSafeInteger(v) && v >= 1;

/** Parse and structurally check manifest bytes (after their signature was checked). */
export function parseManifest(bytes: Uint8Array, where: string): Manifest {
  let raw: Record<string, unknown>;
  try {
    raw = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes));
  } catch (e) {
    throw new VerificationError(`${where}: not valid JSON (truncated or corrupt): ${(e as Error).message}`);
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw new VerificationError(`${where}: expected a JSON object`);
  if (raw["format"] !== "routeopt.policy/1") throw new VerificationError(`${where}: format ${JSON.stringify(raw["format"])} is not "routeopt.policy/1"`);
  if (!positive(raw["version"])) throw new VerificationError(`${where}: version must be a positive integer, got ${JSON.stringify(raw["version"])}`);
  const files = raw["files"];
  if (!Array.isArray(files) || files.length === 0 || files.length > 256) throw new VerificationError(`${where}: files must be a non-empty list of at most 256`);
  const seen = new Set<string>();
  const entries = files.map((f, i): FileEntry => {
    const fw = `${where}: files[${i}]`;
    if (typeof f !== "object" || f === null) throw new VerificationError(`${fw}: expected an object`);
    const path = checkFileName(f.path, `${fw}.path`);
    if (seen.has(path) || path === MANIFEST || path === SIGNATURE) throw new VerificationError(`${fw}.path: ${JSON.stringify(path)} is duplicated or reserved`);
    if (typeof f.sha256 !== "string" || !HEX64.test(f.sha256)) throw new VerificationError(`${fw}.sha256: expected 64 hex digits`);
    if (typeof f.size !== "number" || !Number.isSafeInteger(f.size) || f.size < 0) throw new VerificationError(`${fw}.size: expected a non-negative integer`);
    seen.add(path);
    return { path, sha256: f.sha256, size: f.size };
  });
  const expires = raw["expires_at"];
  const pf = raw["policy_format"];
  return {
    version: raw["version"] as number, createdAt: parseTime(raw["created_at"], `${where}: created_at`),
    expiresAt: expires === null || expires === undefined ? null : parseTime(expires, `${where}: expires_at`),
    expiresText: typeof expires === "string" ? expires : null, files: entries,
    policyFormat: typeof pf === "object" && pf !== null ? (pf as PolicyFormat) : {},
  };
}

export interface Pointer { channel: string; seq: number; version: number; path: string; digest: string; action: string }

/** Check a pointer payload (its signature was checked over its canonical JSON). */
export function parsePointer(p: unknown, where: string): Pointer {
  const o = p as Record<string, unknown>;
  if (typeof o !== "object" || o === null || o["format"] !== "routeopt.channel/1") throw new VerificationError(`${where}: not a routeopt.channel/1 channel pointer`);
  for (const k of ["seq", "version"]) if (!positive(o[k])) throw new VerificationError(`${where}: ${k} must be a positive integer, got ${JSON.stringify(o[k])}`);
  if (typeof o["digest"] !== "string" || !HEX64.test(o["digest"])) throw new VerificationError(`${where}: digest must be 64 hex digits`);
  if (!["publish", "promote", "rollback"].includes(o["action"] as string)) throw new VerificationError(`${where}: action ${JSON.stringify(o["action"])} is not publish, promote or rollback`);
  const version = o["version"] as number, digest = o["digest"];
  const path = o["path"];
  if (typeof path !== "string" || !VERSION_DIR.test(path) || path !== versionDir(version, digest)) {
    throw new VerificationError(`${where}: path: folder ${JSON.stringify(path)} does not match version ${version} / ${digest.slice(0, 12)}`);
  }
  if (typeof o["channel"] !== "string" || !CHANNEL.test(o["channel"])) throw new VerificationError(`${where}: channel ${JSON.stringify(o["channel"])} is not a channel name`);
  return { channel: o["channel"], seq: o["seq"] as number, version, path, digest, action: o["action"] as string };
}

export function versionDir(version: number, digest: string): string {
  return `versions/${String(version).padStart(6, "0")}-${digest.slice(0, 12)}`;
}

export function checkChannel(name: string): string {
  if (!CHANNEL.test(name)) throw new VerificationError(`channel ${JSON.stringify(name)}: use lower-case letters, digits, '-' or '_'`, "config");
  return name;
}

// -- keys and signatures --------------------------------------------------------------------

const SPKI_PREFIX = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];

export interface TrustedKey { keyId: string; key: CryptoKey }

function base64(text: string, where: string): Uint8Array<ArrayBuffer> {
  const clean = text.replace(/\s+/g, "");
  if (clean.length % 4 !== 0 || !/^[A-Za-z0-9+/]*={0,2}$/.test(clean)) throw new VerificationError(`${where}: not base64`);
  const bin = atob(clean);
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}

/** A PEM SubjectPublicKeyInfo Ed25519 key, imported for verifying, with its key id. */
export async function importPublicKey(pem: string | Uint8Array): Promise<TrustedKey> {
  const text = typeof pem === "string" ? pem : new TextDecoder().decode(pem);
  const body = /-----BEGIN PUBLIC KEY-----([\s\S]*?)-----END PUBLIC KEY-----/.exec(text);
  if (!body) throw new VerificationError("public key: not a PEM public key", "config");
  const der = base64(body[1], "public key");
  if (der.length !== 44 || SPKI_PREFIX.some((b, i) => der[i] !== b)) throw new VerificationError("public key: expected an Ed25519 key", "config");
  const raw = der.slice(12);
  const key = await crypto.subtle.importKey("spki", der, { name: "Ed25519" }, false, ["verify"]);
  return { keyId: (await sha256Hex(raw)).slice(0, 16), key };
}

/** Refuse unless `sig` (a {"alg","key_id","signature"} object) is a trusted key's signature of data. */
export async function verifySignature(sig: unknown, data: Uint8Array<ArrayBuffer>, keys: TrustedKey[], what: string): Promise<string> {
  const s = sig as Record<string, unknown>;
  if (typeof s !== "object" || s === null) throw new VerificationError(`${what}: signature must be a JSON object`);
  if (s["alg"] !== "ed25519") throw new VerificationError(`${what}: unsupported signature algorithm ${JSON.stringify(s["alg"])}`);
  const value = base64(String(s["signature"] ?? ""), `${what}: signature`);
  if (value.length !== 64) throw new VerificationError(`${what}: an Ed25519 signature is 64 bytes, got ${value.length}`);
  const trusted = keys.find((k) => k.keyId === s["key_id"]);
  if (!trusted) {
    throw new VerificationError(`${what}: signed by key ${s["key_id"]}, but the trusted key${keys.length === 1 ? " is" : "s are"} ${keys.map((k) => k.keyId).join(", ")}`);
  }
  if (!(await crypto.subtle.verify("Ed25519", trusted.key, value, data))) {
    throw new VerificationError(`${what}: signature does not match the content (tampered or truncated)`);
  }
  return trusted.keyId;
}

// -- order ------------------------------------------------------------------------------------

export interface Seen { seq: number; version: number; digest: string }

/** Never go back: replays, rewrites and downgrades that are not signed rollbacks are refused. */
export function checkOrder(p: Pointer, seen: Seen | null): void {
  if (!seen) return;
  if (p.seq < seen.seq) throw new VerificationError(`channel ${p.channel}: pointer move #${p.seq} is older than #${seen.seq} already seen (replayed)`, "order");
  if (p.seq === seen.seq) {
    if (p.version !== seen.version || p.digest !== seen.digest) {
      throw new VerificationError(`channel ${p.channel}: pointer move #${p.seq} now names version ${p.version}/${p.digest.slice(0, 12)}, but #${seen.seq} was version ${seen.version}/${seen.digest.slice(0, 12)} (rewritten)`, "order");
    }
    return;
  }
  if (p.version < seen.version && p.action !== "rollback") {
    throw new VerificationError(`channel ${p.channel}: version ${p.version} is older than version ${seen.version} already accepted and is not a rollback (downgrade refused)`, "order");
  }
}

export { textBytes };
