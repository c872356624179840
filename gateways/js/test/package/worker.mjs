// A worker as an app writes it, importing the installed package by name; bundled by esbuild
// (as wrangler bundles) and run in workerd by worker-run.mjs.
import { Router, KERNEL_ENGINE } from "@routeopt/gateway";

let router = null;

export default {
  async fetch(request, env) {
    const body = await request.json();
    try {
      router ??= await Router.open({ url: env.REGISTRY_URL, publicKeys: [env.PUBLIC_KEY], channel: "latest" });
    } catch (e) {
      return Response.json({ error: String(e.message) }, { status: 503 });
    }
    const decisions = body.requests.map((r) => router.route(r.prompt, { suite: r.suite, qualityTarget: r.quality_target, requestId: r.id }));
    return Response.json({ decisions, status: router.status(), kernel: KERNEL_ENGINE });
  },
};
