// A gateway process that tests drive over stdin/stdout, one JSON command and one JSON answer
// per line, while they change the registry it polls (tests/gateways/test_js_runtime.py).
import { createInterface } from "node:readline";
import { Router, Gateway } from "../dist/index.js";
import { FileLog } from "../dist/node.js";

let router = null;
let gateway = null;
let log = null;
const events = [];

const ops = {
  async open(c) {
    router = await Router.open({ url: c.url, publicKeys: c.pem ? [c.pem] : [], channel: c.channel, timeoutMs: c.timeoutMs,
      defaultModel: c.defaultModel, onEvent: (kind, message) => events.push([kind, message]) });
    return { version: router.version, status: router.status() };
  },
  async refresh() {
    const swapped = await router.refresh();
    return { swapped, version: router.version, status: router.status(), events: events.splice(0) };
  },
  async route(c) {
    return (gateway ?? router).route(c.prompt, { suite: c.suite, requestId: c.requestId, qualityTarget: c.qualityTarget });
  },
  async routeMany(c) {
    const g = gateway ?? router;
    const t0 = performance.now();
    const out = c.requests.map((r) => g.route(r.prompt, { suite: r.suite, requestId: r.id, qualityTarget: r.quality_target }));
    return { decisions: out, ms: performance.now() - t0 };
  },
  async gateway(c) {
    log = new FileLog(c.logDir, { flushMs: 50 });
    gateway = await Gateway.create(router, { exploration: c.exploration, log, redact: c.keepText ? (t) => t : null });
    return { ok: true };
  },
  async close() {
    await gateway?.close();
    router?.close();
    return { ok: true, written: log?.written ?? 0, dropped: log?.dropped ?? 0 };
  },
};

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  const c = JSON.parse(line);
  let answer;
  try {
    answer = await ops[c.op](c);
  } catch (e) {
    answer = { error: String(e.message ?? e), kind: e.kind ?? null, name: e.name };
  }
  process.stdout.write(JSON.stringify(answer) + "\n");
  if (c.op === "close") break;
}
lines.close();
process.stdin.destroy();
