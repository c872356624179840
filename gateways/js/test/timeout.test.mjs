// Router.open's timeoutMs bounds the whole open: every fetch it makes shares one deadline.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer as createTcpServer } from "node:net";
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { PolicyLoadError, Router } from "../dist/index.js";
import { NO_FIXTURES, ROOT, publicKey } from "./helpers.mjs";

const TIMEOUT_MS = 500;

/** Listen on 127.0.0.1 with `server`; resolves to its base URL and a close(). */
async function listen(server, sockets) {
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}/`,
    close: () => new Promise((resolve) => { for (const s of sockets) s.destroy(); server.close(resolve); }),
  };
}

/** A registry that accepts every connection and never says a word. */
function silentRegistry() {
  const sockets = [];
  return listen(createTcpServer((s) => sockets.push(s)), sockets);
}

/** The fixtures' registry, each answer held back `delayMs`: every fetch alone is well within the
 * timeout, the open's seven or more in a row are not. */
function slowRegistry(delayMs) {
  const sockets = [];
  const server = createServer(async (req, res) => {
    await new Promise((resolve) => setTimeout(resolve, delayMs));
    try {
      const body = await readFile(join(ROOT, "registry", decodeURIComponent(new URL(req.url, "http://x").pathname)));
      res.writeHead(200, { "Content-Length": body.length }).end(body);
    } catch {
      res.writeHead(404).end();
    }
  });
  server.on("connection", (s) => sockets.push(s));
  return listen(server, sockets);
}

async function timed(fn) {
  const t0 = performance.now();
  const out = await fn().then((value) => ({ value }), (error) => ({ error }));
  return { ...out, ms: performance.now() - t0 };
}

test("a registry that never answers fails the open within its timeout, not once per fetch", async () => {
  const registry = await silentRegistry();
  try {
    // no channel given: the open looks for champion, then reads it; each used to wait the full timeout
    const failed = await timed(() => Router.open({ url: registry.url, allowUnsigned: true, timeoutMs: TIMEOUT_MS }));
    assert.ok(failed.error instanceof PolicyLoadError, String(failed.error));
    assert.match(failed.error.message, new RegExp(`no answer within ${TIMEOUT_MS} ms`));
    assert.ok(failed.ms < 2 * TIMEOUT_MS, `the open failed after ${failed.ms.toFixed(0)} ms for a ${TIMEOUT_MS} ms timeout`);

    const served = await timed(() => Router.open({ url: registry.url, allowUnsigned: true, timeoutMs: TIMEOUT_MS, defaultModel: "safe" }));
    assert.ok(served.value, String(served.error));
    assert.equal(served.value.route("hi").model, "safe");
    assert.ok(served.ms < 2 * TIMEOUT_MS, `the default model served after ${served.ms.toFixed(0)} ms for a ${TIMEOUT_MS} ms timeout`);
  } finally {
    await registry.close();
  }
});

test("a registry slow on every file fails the open at the timeout, though each fetch alone would pass", { skip: NO_FIXTURES }, async () => {
  const registry = await slowRegistry(TIMEOUT_MS * 0.3);
  try {
    const failed = await timed(() => Router.open({ url: registry.url, publicKeys: [publicKey()], timeoutMs: TIMEOUT_MS }));
    assert.ok(failed.error instanceof PolicyLoadError, `opened after ${failed.ms.toFixed(0)} ms: ${failed.error}`);
    assert.match(failed.error.message, new RegExp(`no answer within ${TIMEOUT_MS} ms`));
    assert.ok(failed.ms < 2 * TIMEOUT_MS, `the open failed after ${failed.ms.toFixed(0)} ms for a ${TIMEOUT_MS} ms timeout`);

    const opened = await timed(() => Router.open({ url: registry.url, publicKeys: [publicKey()], timeoutMs: 60000 }));
    assert.ok(opened.value, String(opened.error));
    assert.ok(opened.value.version >= 1);
  } finally {
    await registry.close();
  }
});
