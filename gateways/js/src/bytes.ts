/**
 * Section 3, "Bytes": a prompt's UTF-8 bytes, the counts taken over the whole text, and the
 * head/tail cut.
 *
 * `TextEncoder` already does what section 3.1 asks: an unpaired surrogate becomes U+FFFD, a
 * surrogate pair the character it denotes.
 */

export const MAX_BYTES = 8192;
const HALF = MAX_BYTES / 2;
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

export function promptBytes(prompt: string): PromptBytes {
  const raw = encoder.encode(prompt);
  let continuation = 0, newlines = 0, questions = 0;
  const ascii = raw.length === prompt.length;
  for (let i = 0; i < raw.length; i++) {
    const b = raw[i];
    if (b === 0x0a) newlines++;
    else if (b === 0x3f) questions++;
    else if (!ascii && (b & 0xc0) === 0x80) continuation++;
  }
  let cut = raw;
  if (raw.length > MAX_BYTES) {
    cut = new Uint8Array(MAX_BYTES);
    cut.set(raw.subarray(0, HALF), 0);
    cut.set(raw.subarray(raw.length - HALF), HALF);
  }
  return { raw, utf8Len: raw.length, nChars: raw.length - continuation, newlines, questions, cut };
}
