/**
 * Section 2.1, "The container": safetensors, read with every check the spec lists.
 *
 * Tensors are typed-array views of the file's bytes when aligned and the platform is
 * little-endian (every JavaScript platform in use), copies otherwise.
 */

export class FormatError extends Error {
  override name = "FormatError";
}

export type Dtype = "F64" | "F32" | "I64" | "U64" | "I32" | "U32" | "I16" | "U16" | "I8" | "U8";
export type Typed = Float64Array | Float32Array | Int32Array | Uint32Array | Int16Array | Uint16Array | Int8Array | Uint8Array | BigInt64Array | BigUint64Array;

export interface Tensor {
  dtype: Dtype;
  shape: number[];
  data: Typed;
}

const SIZES: Record<Dtype, number> = { F64: 8, F32: 4, I64: 8, U64: 8, I32: 4, U32: 4, I16: 2, U16: 2, I8: 1, U8: 1 };
const MAX_HEADER = 1 << 24;
const LITTLE = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

function view(dtype: Dtype, buffer: ArrayBuffer, offset: number, length: number): Typed {
  switch (dtype) {
    case "F64": return new Float64Array(buffer, offset, length);
    case "F32": return new Float32Array(buffer, offset, length);
    case "I64": return new BigInt64Array(buffer, offset, length);
    case "U64": return new BigUint64Array(buffer, offset, length);
    case "I32": return new Int32Array(buffer, offset, length);
    case "U32": return new Uint32Array(buffer, offset, length);
    case "I16": return new Int16Array(buffer, offset, length);
    case "U16": return new Uint16Array(buffer, offset, length);
    case "I8": return new Int8Array(buffer, offset, length);
    case "U8": return new Uint8Array(buffer, offset, length);
  }
}

function isCount(x: unknown): x is number {
  return typeof x === "number" && Number.isInteger(x) && x >= 0;
}

/** The tensors and metadata of a container; `where` names the file in every error. */
export function readContainer(bytes: Uint8Array, where: string): { tensors: Map<string, Tensor>; metadata: Record<string, string> } {
  if (bytes.length < 8) throw new FormatError(`${where}: ${bytes.length} bytes is too short for a safetensors header`);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const size = dv.getUint32(0, true) + dv.getUint32(4, true) * 4294967296;
  if (size > Math.min(MAX_HEADER, bytes.length - 8)) {
    throw new FormatError(`${where}: header length ${size} runs past the file (${bytes.length} bytes; truncated?)`);
  }
  let header: unknown;
  try {
    header = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bytes.subarray(8, 8 + size)));
  } catch (e) {
    throw new FormatError(`${where}: header is not JSON (${(e as Error).message})`);
  }
  if (typeof header !== "object" || header === null || Array.isArray(header)) throw new FormatError(`${where}: header must be a JSON object`);
  const entries = header as Record<string, unknown>;
  const metadata = (entries["__metadata__"] ?? {}) as Record<string, unknown>;
  if (typeof metadata !== "object" || metadata === null || Object.values(metadata).some((v) => typeof v !== "string")) {
    throw new FormatError(`${where}: __metadata__ must map names to strings`);
  }
  const bodyStart = 8 + size;
  const bodyLength = bytes.length - bodyStart;
  const spans: { name: string; begin: number; end: number; dtype: Dtype; shape: number[] }[] = [];
  for (const [name, raw] of Object.entries(entries)) {
    if (name === "__metadata__") continue;
    const e = raw as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    if (typeof e !== "object" || e === null || typeof e.dtype !== "string" || !(e.dtype in SIZES)) {
      throw new FormatError(`${where}: tensor ${JSON.stringify(name)}: dtype must be one of ${Object.keys(SIZES).sort().join(", ")}`);
    }
    const dtype = e.dtype as Dtype;
    if (!Array.isArray(e.shape) || !e.shape.every(isCount)) throw new FormatError(`${where}: tensor ${JSON.stringify(name)}: shape must be a list of non-negative integers`);
    const off = e.data_offsets;
    if (!Array.isArray(off) || off.length !== 2 || !off.every(isCount)) throw new FormatError(`${where}: tensor ${JSON.stringify(name)}: data_offsets must be [begin, end]`);
    const count = (e.shape as number[]).reduce((a, b) => a * b, 1);
    if (off[1] - off[0] !== count * SIZES[dtype]) throw new FormatError(`${where}: tensor ${JSON.stringify(name)}: ${off[1] - off[0]} bytes for shape [${e.shape}]`);
    spans.push({ name, begin: off[0], end: off[1], dtype, shape: e.shape as number[] });
  }
  spans.sort((a, b) => a.begin - b.begin || a.end - b.end);
  const tensors = new Map<string, Tensor>();
  let at = 0;
  for (const s of spans) {
    if (s.begin !== at) throw new FormatError(`${where}: tensor ${JSON.stringify(s.name)} starts at byte ${s.begin}, expected ${at} (gap or overlap)`);
    if (s.end > bodyLength) throw new FormatError(`${where}: tensor ${JSON.stringify(s.name)} ends at byte ${s.end} of ${bodyLength} (truncated)`);
    if (s.begin % SIZES[s.dtype]) throw new FormatError(`${where}: tensor ${JSON.stringify(s.name)} is not aligned to its element size`);
    const absolute = bytes.byteOffset + bodyStart + s.begin;
    const length = (s.end - s.begin) / SIZES[s.dtype];
    let data: Typed;
    if (LITTLE && absolute % SIZES[s.dtype] === 0) {
      data = view(s.dtype, bytes.buffer as ArrayBuffer, absolute, length);
    } else {
      const copy = bytes.slice(bodyStart + s.begin, bodyStart + s.end);
      if (!LITTLE) swap(copy, SIZES[s.dtype]);
      data = view(s.dtype, copy.buffer, 0, length);
    }
    tensors.set(s.name, { dtype: s.dtype, shape: s.shape, data });
    at = s.end;
  }
  if (at !== bodyLength) throw new FormatError(`${where}: ${bodyLength - at} bytes after the last tensor (or the file is truncated)`);
  return { tensors, metadata: metadata as Record<string, string> };
}

function swap(bytes: Uint8Array, size: number): void {
  for (let i = 0; i < bytes.length; i += size) bytes.subarray(i, i + size).reverse();
}

/** The tensor `name` with one of `dtypes` and the shape the policy implies (-1: any size). */
export function need(tensors: Map<string, Tensor>, name: string, dtypes: Dtype[], shape: number[], where: string): Typed {
  const t = tensors.get(name);
  if (!t) throw new FormatError(`${where}: tensor ${JSON.stringify(name)} is missing`);
  if (!dtypes.includes(t.dtype)) throw new FormatError(`${where}: tensor ${JSON.stringify(name)} is ${t.dtype}, expected ${dtypes.join(" or ")}`);
  if (t.shape.length !== shape.length || shape.some((w, i) => w >= 0 && w !== t.shape[i])) {
    throw new FormatError(`${where}: tensor ${JSON.stringify(name)} has shape [${t.shape}], expected [${shape}]`);
  }
  return t.data;
}
