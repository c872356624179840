/**
 * Section 3, "Bytes": a prompt's UTF-8 bytes, the counts taken over the whole text, and the
 * head/tail cut.
 *
 * `TextEncoder` already does what section 3.1 asks: an unpaired surrogate becomes U+FFFD, a
 * surrogate pair the character it denotes. A decision encodes into a reused buffer
 * (`encodeInto`: no allocation, and an order of magnitude faster than `encode` in Node).
 */

export const MAX_BYTES = 8192;
const HALF = MAX_BYTES / 2;
/** Prompts up to this many bytes are encoded into a reused buffer; longer ones get their own. */
const MAX_REUSED = 1 << 20;
const encoder = new TextEncoder();

export interface PromptBytes {
  /** the whole text's bytes (section 3.1) */
  raw: Uint8Array;
  utf8Len: number;
  /** code points: bytes not of the form 10xxxxxx */
  nChars: number;
  newlines: number;
  questions: number;
  /** the first and last 4096 bytes of a longer text, else all of them */
  cut: Uint8Array;
}

/** The bytes of a prompt, suite or request id. */
export function textBytes(text: string): Uint8Array<ArrayBuffer> {
  return encoder.encode(text);
}

/** Where a decision's prompt bytes go: `raw` and `cut` of its PromptBytes are views of these
 * buffers, good until the next prompt is encoded into them. */
export class ByteScratch {
  private buf: Uint8Array;
  private cutBuf: Uint8Array | null = null;

  constructor(size = 16384) {
    this.buf = new Uint8Array(size);
  }

  /** A buffer for the cut of a longer text. */
  get cut(): Uint8Array {
    return (this.cutBuf ??= new Uint8Array(MAX_BYTES));
  }

  /** The UTF-8 bytes of `text`, a view of the buffer (grown when it might not fit). */
  encode(text: string): Uint8Array {
    const most = text.length * 3; // UTF-8 bytes per UTF-16 code unit, at most
    if (most > this.buf.length) {
      if (most > MAX_REUSED) return encoder.encode(text);
      let size = this.buf.length;
      while (size < most) size *= 2;
      this.buf = new Uint8Array(size);
    }
    return this.buf.subarray(0, encoder.encodeInto(text, this.buf).written);
  }
}

/** How often the code unit `unit` occurs in `text`; counts of 0x0a and 0x3f in the UTF-8 bytes
 * are counts in the string, as neither byte occurs inside a multi-byte character. */
function occurrences(text: string, unit: string): number {
  let n = 0;
  for (let i = text.indexOf(unit); i >= 0; i = text.indexOf(unit, i + 1)) n++;
  return n;
}

/** Code points: bytes not of the form 10xxxxxx (every byte of an ASCII text). */
function codePoints(raw: Uint8Array, textLength: number): number {
  if (raw.length === textLength) return textLength;
  let continuation = 0;
  for (let i = 0; i < raw.length; i++) if ((raw[i] & 0xc0) === 0x80) continuation++;
  return raw.length - continuation;
}

/** Section 3 for one prompt; with `scratch`, raw and cut are views of its buffers unless `own`
 * asks for copies (encodeInto and a copy are still faster than `encode`). Without `counted`,
 * newlines and questions are left at -1 for the caller, where the cut is the whole text and a
 * pass over its bytes counts them anyway (the WebAssembly words loop does). */
export function promptBytes(prompt: string, scratch?: ByteScratch, own = false, counted = true): PromptBytes {
  let raw = scratch ? scratch.encode(prompt) : encoder.encode(prompt);
  if (own && scratch) raw = raw.slice();
  let cut = raw;
  if (raw.length > MAX_BYTES) {
    cut = scratch && !own ? scratch.cut : new Uint8Array(MAX_BYTES);
    cut.set(raw.subarray(0, HALF), 0);
    cut.set(raw.subarray(raw.length - HALF), HALF);
  }
  const count = counted || cut !== raw;
  return { raw, utf8Len: raw.length, nChars: codePoints(raw, prompt.length), newlines: count ? occurrences(prompt, "\n") : -1,
    questions: count ? occurrences(prompt, "?") : -1, cut };
}
