"""The dashboard's Jinja template: inline CSS and JS only, so the file works with no network."""

PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>routeopt - run {{ d.run.run_id }}</title>
<style>
:root { --fg:#111827; --muted:#6b7280; --line:#e5e7eb; --bg:#ffffff; --card:#f9fafb;
        --bad:#b91c1c; --good:#15803d; --info:#1d4ed8; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       background: var(--bg); margin: 0 auto; max-width: 1240px; padding: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.muted { color: var(--muted); }
.cards { display: flex; gap: 12px; flex-wrap: wrap; margin: 16px 0; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px;
        min-width: 150px; }
.card b { display: block; font-size: 20px; }
table { border-collapse: collapse; width: 100%; margin: 6px 0 12px; font-variant-numeric: tabular-nums; }
th, td { border-bottom: 1px solid var(--line); padding: 5px 8px; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { background: var(--card); cursor: pointer; user-select: none; position: sticky; top: 0; }
th.sorted-asc::after { content: " \25B2"; } th.sorted-desc::after { content: " \25BC"; }
.charts { display: flex; flex-wrap: wrap; gap: 16px; }
svg.chart { background: #fff; border: 1px solid var(--line); border-radius: 8px; max-width: 100%; height: auto; }
svg .plot-bg { fill: #fcfcfd; } svg .grid { stroke: var(--line); stroke-width: 1; }
svg .tick, svg .legend { font-size: 11px; fill: var(--muted); } svg .axis { font-size: 12px; fill: var(--fg); } svg .label { font-size: 11px; fill: var(--fg); }
svg .series { stroke-width: 2; } svg .mark:hover { opacity: .7; }
.sev-regression { color: var(--bad); font-weight: 600; } .sev-improvement { color: var(--good); }
.sev-info { color: var(--info); }
.empty { padding: 20px; color: var(--muted); border: 1px dashed var(--line); border-radius: 8px; }
.scroll { overflow-x: auto; }
</style>
</head>
<body data-run="{{ d.run.run_id }}">
<header>
  <h1>routeopt nightly report</h1>
  <div class="muted">run <code>{{ d.run.run_id }}</code> - {{ d.run.status }} - started {{ d.run.started_at }}
  {% if d.run.finished_at %}- finished {{ d.run.finished_at }}{% endif %} - generated {{ d.generated_at }}</div>
</header>
<section class="cards">
  <div class="card"><span class="muted">candidates</span><b>{{ d.candidates|length }}</b></div>
  <div class="card"><span class="muted">suites</span><b>{{ d.suites|length }}</b></div>
  <div class="card"><span class="muted">outcomes</span><b>{{ total_items }}</b></div>
  <div class="card"><span class="muted">spend (USD)</span><b>{{ total_cost|num(".4g") }}</b></div>
  <div class="card"><span class="muted">drift regressions</span>
    <b class="{{ 'sev-regression' if d.drift and d.drift.regressions else '' }}">
      {{ d.drift.regressions|length if d.drift else "-" }}</b></div>
  <div class="card" id="policy-tile"><span class="muted">policy published</span>
    <b>{{ "v%d" % d.policy_version if d.policy_version else "none" }}</b>
    {% if d.policy_status %}<span class="muted">{{ d.policy_status }}</span>{% endif %}</div>
</section>

<h2>Candidates</h2>
<div class="scroll"><table class="sortable" id="candidates">
<thead><tr><th>candidate</th><th>items</th><th>errors</th><th>excluded</th><th>cached</th><th>pass rate</th>
<th>cost USD</th><th>USD / passing answer</th><th>tokens in</th><th>tokens out</th>
<th>TTFT p50</th><th>TTFT p95</th><th>TTFT p99</th><th>latency p50</th><th>latency p95</th><th>latency p99</th></tr></thead>
<tbody>
{% for r in d.candidates %}
<tr><td>{{ r.candidate }}</td><td>{{ r["items"] }}</td><td>{{ r.errors }}</td><td>{{ r.excluded }}</td>
<td>{{ r.cached }}</td>
<td data-v="{{ r.pass_rate if r.pass_rate is not none else '' }}">{{ r.pass_rate|pct }}</td>
<td>{{ r.cost_usd|num }}</td><td>{{ r.cost_per_pass|num }}</td>
<td>{{ r.input_tokens|num(",.0f") }}</td><td>{{ r.output_tokens|num(",.0f") }}</td>
<td>{{ r.ttft_p50|num(".3f") }}</td><td>{{ r.ttft_p95|num(".3f") }}</td><td>{{ r.ttft_p99|num(".3f") }}</td>
<td>{{ r.latency_p50|num(".3f") }}</td><td>{{ r.latency_p95|num(".3f") }}</td><td>{{ r.latency_p99|num(".3f") }}</td></tr>
{% endfor %}
</tbody></table></div>
<p class="muted">Pass rate over graded answers and the candidate's own errors (timeouts, truncated
streams, refusals), which count as failures; <em>excluded</em> rows are errors on our side (spend
cap, open circuit breaker, refused key, configuration, grader or routeopt faults) and count
nowhere. Cost, tokens and times (in seconds) are this run's calls: answers replayed from the
response cache (<em>cached</em>) count in pass rates only.</p>

{% if d.modes %}
<h2>How items were answered</h2>
<div class="scroll"><table class="sortable" id="modes">
<thead><tr><th>candidate</th><th>batch</th><th>sync</th><th>carried</th><th>latency rows</th><th>batches</th>
<th>cost USD</th><th>full sync night USD</th></tr></thead>
<tbody>
{% for r in d.modes %}
<tr><td>{{ r.candidate }}</td><td>{{ r.batch }}</td><td>{{ r.sync }}</td><td>{{ r.carried }}</td>
<td>{{ r.latency_rows }}</td><td>{{ r.states }}</td><td>{{ r.cost_usd|num }}</td><td>{{ r.full_sync_usd|num }}</td></tr>
{% endfor %}
</tbody></table></div>
<p class="muted" id="modes-total">This night cost {{ modes_cost|num(".4g") }} USD against {{ modes_full|num(".4g") }} USD
for a full synchronous night{% if modes_full %} ({{ (modes_cost / modes_full)|pct }}){% endif %}.
<em>batch</em>: answered through the provider's Batch API at batch prices (no TTFT or latency: queue
time is not the model's); <em>carried</em>: an earlier night's outcome of an unchanged item, in pass
rates, not in cost; latency figures come from the <em>latency rows</em> (synchronous calls).
{% if batch_option %}Batch mode turned on for this run by <code>--batch</code>: {{ batch_option }}.{% endif %}</p>
{% endif %}

<h2>Router: what the quality knob gives</h2>
{% if knob_rows %}
{% set H = d.metrics.holdout %}
<p>On {{ H.n_test_requests }} held-out requests, the policy fitted without them (the one these figures
describe{% if H.policy %}: {{ H.policy }}{% endif %}), at each quality target. Target x promises a pass rate of
at least x times the reference model's ({{ H.best_single.model }}, the best single candidate on the training
requests: {{ H.promise.reference_pass_rate|num(".3f") }} on these), with confidence
{{ H.promise.confidence|num(".2g") }}, wherever the knob certified x. &plusmn; is 1.96 standard errors of
the paired margin on these {{ H.promise.n }} requests: a gap smaller than that is noise.
{% if promise_line %}<b id="promise-line">{{ promise_line }}</b>.{% endif %}</p>
<div class="scroll"><table class="sortable" id="knob">
<thead><tr><th>target</th><th>certified</th><th>floor</th><th>pass rate</th><th>margin &plusmn; noise</th>
<th>USD / request</th><th>cost vs best single</th><th>verdict</th></tr></thead>
<tbody>
{% for r in knob_rows %}
<tr class="{{ 'sev-regression' if r.verdict == 'refuted' else '' }}"><td>{{ r.target|num("g") }}</td>
<td>{{ "yes" if r.certified else "no" }}</td><td>{{ r.floor|num(".3f") }}</td><td>{{ r.pass_rate|num(".3f") }}</td>
<td>{{ r.margin|num("+.3f") }} &plusmn; {{ r.noise|num(".3f") }}</td><td>{{ r.cost|num(".3g") }}</td>
<td>{{ r.cost_ratio|num(".3f") }}</td><td>{{ r.verdict }}</td></tr>
{% endfor %}
</tbody></table></div>
{% endif %}
{% if budget_rows %}
{% set LB = d.metrics.holdout.latency %}
<h3>Latency budgets</h3>
<p>The same held-out requests under each latency budget the policy certified (on the p95): the pass rate and
cost of its choices, and the share of them whose measured latency exceeded the budget, which each certified
(budget, target) pair promises to keep at or below {{ LB.alpha|num(".2g") }}. Held at {{ LB.held }} of
{{ LB.promised }} certified pairs.</p>
<div class="scroll"><table class="sortable" id="budgets">
<thead><tr><th>budget</th><th>target</th><th>certified</th><th>pass rate</th><th>USD / request</th>
<th>over budget</th><th>measured</th><th>verdict</th></tr></thead>
<tbody>
{% for r in budget_rows %}
<tr class="{{ 'sev-regression' if r.certified and not r.held else '' }}"><td>{{ r.kind }} {{ r.budget_s|num("g") }} s</td>
<td>{{ r.target|num("g") }}</td><td>{{ "yes" if r.certified else "no" }}</td><td>{{ r.pass_rate|num(".3f") }}</td>
<td>{{ r.cost|num(".3g") }}</td><td>{{ r.over_budget|num(".3f") }}</td><td>{{ r.measured }}</td>
<td>{{ ("held" if r.held else "missed") if r.certified else "not certified" }}</td></tr>
{% endfor %}
</tbody></table></div>
{% endif %}
<div class="charts">{{ cost_quality|safe }}</div>
{% if router_rows %}
<h3>Beside baselines (upper bounds)</h3>
<p class="muted">Savings and AIQ below are read off the upper hull of points measured on the same held-out
requests (the baselines' &lambda; is swept on them): what a knob tuned after seeing those requests could
reach, not what a target delivers. The table above is what a target delivers.</p>
<table class="sortable" id="router">
<thead><tr><th>policy</th><th>pass rate</th><th>USD / request</th><th>savings at best quality (upper bound)</th>
<th>savings at 95% (upper bound)</th><th>AIQ (upper bound)</th></tr></thead>
<tbody>
{% for r in router_rows %}
<tr><td>{{ r.name }}</td><td>{{ r.pass_rate|pct }}</td><td>{{ r.cost|num }}</td>
<td>{{ r.summary.savings_at_best|pct }}</td><td>{{ r.summary.savings_at_95|pct }}</td>
<td>{{ r.summary.aiq|num(".3f") }}</td></tr>
{% endfor %}
</tbody></table>
{% else %}
<p class="muted">No published policy metrics for this run: the chart shows the candidates alone.</p>
{% endif %}

<h2>Live traffic: champion vs candidate</h2>
{% if d.live %}
{% set L = d.live %}
<p class="muted">Decision logs from {{ L.since[:16] }} to {{ L.until[:16] }}: {{ L.logged }} requests,
{{ L.feedback }} with feedback; {{ L.explored|pct }} explored, {{ L.shadowed|pct }} with a shadow decision,
{{ L.with_text|pct }} with kept text. Off-policy estimates (doubly robust, 95% intervals) from the
served and shadow records.</p>
<table class="sortable" id="live">
<thead><tr><th>policy</th><th>version</th><th>requests</th><th>agrees with served</th><th>pass rate</th>
<th>USD / request</th><th>IPS</th><th>SNIPS</th><th>ESS</th></tr></thead>
<tbody>
{% for p in L.policies %}
<tr><td>{{ p.label }}</td><td>{{ p.version if p.version is not none else "-" }}</td><td>{{ p.n_evaluated }}</td>
<td>{{ p.agreement|pct }}</td><td>{{ p.pass_rate.dr|ci }}</td><td>{{ p.cost.dr|ci(".3g") }}</td>
<td>{{ p.pass_rate.ips.value|num(".3f") if p.pass_rate.ips else "-" }}</td>
<td>{{ p.pass_rate.snips.value|num(".3f") if p.pass_rate.snips else "-" }}</td>
<td>{{ p.pass_rate.dr.ess|num(".0f") if p.pass_rate.dr else "-" }}</td></tr>
{% endfor %}
</tbody></table>
{% if L.difference %}
<p>Candidate minus champion, paired on {{ L.difference.pass_rate_diff.n }} requests: pass rate
{{ L.difference.pass_rate_diff|ci("+.3f") }}, USD per request {{ L.difference.cost_diff|ci("+.3g") }}.</p>
{% endif %}
{% if L.canary %}
<p>Canary arms (served requests, exploration included): champion {{ L.canary.champion|ci }}
({{ L.canary.champion.n }}), candidate {{ L.canary.candidate|ci }} ({{ L.canary.candidate.n }});
difference {{ L.canary.difference|ci("+.3f") }}.</p>
{% endif %}
{% else %}
<p class="muted">No decision logs in the store: see "Production traffic" in the README.</p>
{% endif %}

<h2>Live traffic: does it still look like the requests the policy was certified on?</h2>
{% if d.traffic %}
{% set T = d.traffic %}
<p id="traffic-summary" class="{{ 'sev-regression' if T.alert else '' }}">{{ T.summary }}</p>
{% if T.shift and T.shift.features %}
<table class="sortable" id="shift">
<thead><tr><th>feature</th><th>p (Holm-adjusted)</th><th>total variation</th><th>moved</th></tr></thead>
<tbody>
{% for f in T.shift.features %}
<tr><td>{{ f.feature }}</td><td>{{ f.p_adjusted|num(".2g") }}</td><td>{{ f.effect|num(".3f") }}</td>
<td class="{{ 'sev-regression' if f.moved else '' }}">{{ "yes" if f.moved else "no" }}</td></tr>
{% endfor %}
</tbody></table>
{% if T.shift.suites_moved %}
<p>Suites whose share moved: {% for m in T.shift.suites_moved %}{{ m.suite }} {{ m.reference|pct }} &rarr; {{ m.live|pct }}{{ "; " if not loop.last }}{% endfor %}</p>
{% endif %}
{% endif %}
<p class="muted">The logged suites, prompt lengths and predicted pass probabilities of the requests
policy version {{ T.version }} served, against the sketch of the requests it was certified on
(chi-square tests, Holm-adjusted; a feature moved when p &lt; {{ T.shift.alpha if T.shift else "-" }}
and its total variation is at least {{ T.shift.min_effect if T.shift else "-" }}). With feedback,
the promise at its target on live traffic (doubly robust).</p>
{% else %}
<p class="muted">No traffic check: no champion policy or no decision logs in the store.</p>
{% endif %}

<h2>Load replay: latency vs speed</h2>
{% if d.replay %}
{% set R = d.replay %}
<div class="charts">{{ R.chart|safe }}</div>
<table class="sortable" id="replay">
<thead><tr><th>speed</th><th>status</th><th>offered req/s</th><th>achieved req/s</th><th>good share</th>
<th>TTFT p95</th><th>TTFT p99</th><th>E2E p95</th><th>E2E p99</th><th>send lateness p99</th><th>errors</th><th>meets SLO</th></tr></thead>
<tbody>
{% for r in R.rows %}
<tr><td>{{ r.speed|num(".3g") }}x{% if r.probe %} (probe {{ r.probe + 1 }}){% endif %}</td><td>{{ r.status }}{% if r.generator_limited %} (generator fell behind){% endif %}</td>
<td>{{ r.offered_rps|num(".3g") }}</td><td>{{ r.achieved_rps|num(".3g") }}</td><td>{{ r.good_share|pct }}</td>
<td>{{ r.ttft_p95|num(".3f") }}</td><td>{{ r.ttft_p99|num(".3f") }}</td><td>{{ r.e2e_p95|num(".3f") }}</td>
<td>{{ r.e2e_p99|num(".3f") }}</td><td>{{ r.lateness_p99|num(".4f") }}</td><td>{{ r.errors }}</td>
<td>{{ "yes" if r.meets_slo else "no" }}</td></tr>
{% endfor %}
</tbody></table>
<p class="muted">Replay {{ R.replay_id }} of {{ R.source }} (times in seconds). Speeds where the generator
could not send on time are left off the curves: their latencies describe the sending machine.</p>
{% else %}
<p class="muted">No load replay in the store: <code>routeopt bench replay LOG --speed 1,2,5</code>.</p>
{% endif %}

<h2>Trends over the last {{ d.trend.run_id.nunique() }} runs</h2>
<div class="charts">
{% for c in trends %}{{ c|safe }}{% else %}<div class="empty">no earlier runs</div>{% endfor %}
</div>

<h2>Per suite</h2>
{% for suite, rows in d.suites.items() %}
<h3>{{ suite }}</h3>
<div class="scroll"><table class="sortable suite" data-suite="{{ suite }}">
<thead><tr><th>candidate</th><th>items</th><th>errors</th><th>excluded</th><th>pass rate</th><th>cost USD</th>
<th>USD / pass</th><th>TTFT p95</th><th>latency p50</th><th>latency p95</th><th>latency p99</th></tr></thead>
<tbody>
{% for r in rows %}
<tr><td>{{ r.candidate }}</td><td>{{ r["items"] }}</td><td>{{ r.errors }}</td><td>{{ r.excluded }}</td>
<td data-v="{{ r.pass_rate if r.pass_rate is not none else '' }}">{{ r.pass_rate|pct }}</td>
<td>{{ r.cost_usd|num }}</td><td>{{ r.cost_per_pass|num }}</td><td>{{ r.ttft_p95|num(".3f") }}</td>
<td>{{ r.latency_p50|num(".3f") }}</td><td>{{ r.latency_p95|num(".3f") }}</td><td>{{ r.latency_p99|num(".3f") }}</td></tr>
{% endfor %}
</tbody></table></div>
{% endfor %}

<h2>Drift alerts</h2>
{% if d.drift is none %}
<p class="muted">Drift was not computed for this report.</p>
{% elif not d.drift.findings %}
<p>No drift against {{ d.drift.baseline_runs|length }} earlier runs ({{ d.drift.compared_pairs }} candidate x suite pairs compared).</p>
{% else %}
<p class="muted">Against runs {{ d.drift.baseline_runs|join(", ") }}; q = Benjamini-Hochberg adjusted p-value.</p>
<table class="sortable" id="drift">
<thead><tr><th>severity</th><th>candidate</th><th>suite</th><th>metric</th><th>baseline</th><th>current</th>
<th>change</th><th>q</th><th>n (now / before)</th></tr></thead>
<tbody>
{% for f in d.drift.findings %}
<tr class="sev-{{ f.severity }}"><td>{{ f.severity }}</td><td>{{ f.candidate }}</td><td>{{ f.suite }}</td>
<td>{{ f.metric }}</td><td>{{ f.baseline|num }}</td><td>{{ f.current|num }}</td><td>{{ f.change|num("+.3g") }}</td>
<td>{{ f.q_value|num(".2g") }}</td><td>{{ f.n_current }} / {{ f.n_baseline }}</td></tr>
{% endfor %}
</tbody></table>
{% endif %}

<footer class="muted"><p>routeopt - self-contained report; no external resources.</p></footer>
<script>
(function () {
  "use strict";
  function cellValue(td) {
    var v = td.getAttribute("data-v");
    var text = v !== null ? v : td.textContent.trim();
    var num = parseFloat(text.replace(/[%,]/g, ""));
    return isNaN(num) ? text.toLowerCase() : num;
  }
  function sortBy(table, col, th) {
    var body = table.tBodies[0];
    var asc = !th.classList.contains("sorted-asc");
    table.querySelectorAll("th").forEach(function (h) { h.classList.remove("sorted-asc", "sorted-desc"); });
    th.classList.add(asc ? "sorted-asc" : "sorted-desc");
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a.cells[col]), y = cellValue(b.cells[col]);
      if (typeof x !== typeof y) { return typeof x === "number" ? -1 : 1; }
      return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("th").forEach(function (th, col) {
      th.addEventListener("click", function () { sortBy(table, col, th); });
    });
  });
  var charts = document.querySelectorAll("svg.chart");
  var marks = document.querySelectorAll("svg.chart .mark").length;
  var rows = document.querySelectorAll("table tbody tr").length;
  document.body.setAttribute("data-rendered", JSON.stringify({
    charts: charts.length, marks: marks, tables: document.querySelectorAll("table").length, rows: rows
  }));
})();
</script>
</body>
</html>
"""
