/**
 * Node only: decision logs as rotated JSONL files, named as Python's DecisionLog names them
 * (`decisions-<YYYYmmddTHHMMSSZ>-<pid>-<6 hex>.jsonl`), so `routeopt import decisions FOLDER`
 * reads a folder of them. Lines are buffered and appended by a timer: routing never waits.
 */

import { appendFileSync, mkdirSync } from "node:fs";
import { appendFile } from "node:fs/promises";
import { randomBytes } from "node:crypto";
import { join } from "node:path";

import type { LogSink } from "./gateway.js";

export interface FileLogOptions {
  maxFileBytes?: number;
  flushMs?: number;
  maxQueue?: number;
}

export class FileLog implements LogSink {
  private queue: string[] = [];
  private file: string | null = null;
  private bytes = 0;
  private timer: ReturnType<typeof setInterval>;
  private writing: Promise<void> = Promise.resolve();
  dropped = 0;
  written = 0;
  lastError: string | null = null;

  constructor(readonly folder: string, private readonly opts: FileLogOptions = {}) {
    mkdirSync(folder, { recursive: true });
    this.timer = setInterval(() => void this.flush(), opts.flushMs ?? 500);
    this.timer.unref();
  }

  write(line: string): void {
    if (this.queue.length >= (this.opts.maxQueue ?? 10000)) {
      this.dropped++;
      return;
    }
    this.queue.push(line);
  }

  private path(): string {
    if (!this.file || this.bytes >= (this.opts.maxFileBytes ?? 64 << 20)) {
      const stamp = new Date().toISOString().replace(/[-:]/g, "").slice(0, 15) + "Z";
      this.file = join(this.folder, `decisions-${stamp}-${process.pid}-${randomBytes(3).toString("hex")}.jsonl`);
      this.bytes = 0;
    }
    return this.file;
  }

  /** Append what is queued (also on a timer). */
  flush(): Promise<void> {
    const lines = this.queue;
    if (!lines.length) return this.writing;
    this.queue = [];
    const text = lines.join("\n") + "\n";
    this.writing = this.writing.then(() => appendFile(this.path(), text, "utf8")).then(() => {
      this.bytes += Buffer.byteLength(text);
      this.written += lines.length;
    }, (e: Error) => {
      this.dropped += lines.length;
      this.lastError = e.message;
    });
    return this.writing;
  }

  async close(): Promise<void> {
    clearInterval(this.timer);
    await this.flush();
  }

  /** Write what is queued now, synchronously (process exit). */
  flushSync(): void {
    if (!this.queue.length) return;
    appendFileSync(this.path(), this.queue.join("\n") + "\n", "utf8");
    this.written += this.queue.length;
    this.queue = [];
  }
}
