// A Cloudflare-style worker (run by workerd through miniflare): no file system, only fetch and
// WebCrypto. It loads the policy from the registry URL in its environment, verifies and
// self-checks it, and routes the prompts it is sent.
import { Router, Gateway, MemoryLog, BLAKE2B_ENGINE, KERNEL_ENGINE } from "../../dist/index.js";

let router = null;

export default {
  async fetch(request, env) {
    const body = await request.json();
    const started = Date.now();
    try {
      router ??= await Router.open({ url: env.REGISTRY_URL, publicKeys: [env.PUBLIC_KEY], channel: "latest" });
    } catch (e) {
      return Response.json({ error: String(e.message), kind: e.kind ?? null }, { status: 503 });
    }
    const gateway = await Gateway.create(router, { log: new MemoryLog(), exploration: { rate: 0.1, seed: 1 } });
    const decisions = body.requests.map((r) => router.route(r.prompt, { suite: r.suite, qualityTarget: r.quality_target, requestId: r.id,
      ttftBudgetS: r.ttft_budget_s, latencyBudgetS: r.latency_budget_s }));
    gateway.route("logged", { requestId: "g1" });
    return Response.json({
      decisions, status: router.status(), loadMs: Date.now() - started,
      environment: { process: typeof process, require: typeof require, fs: typeof globalThis.Deno }, blake2b: BLAKE2B_ENGINE,
      kernel: KERNEL_ENGINE,
    });
  },
};
