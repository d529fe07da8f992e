// Overview (`#/overview`): how many jobs are in each state now, how many runners are alive,
// and the last hour as two charts: throughput (jobs finished per minute, by outcome) and
// depth (jobs waiting or running, stacked by state). The charts read the per-minute samples
// the leading runner records, so they cost the database sixty small rows, not a count.

import * as api from "../api.js";
import { chart } from "../chart.js";
import { h, replace } from "../dom.js";
import { DEPTH, FINISHED, STATES, count } from "../format.js";
import { href } from "../router.js";

const HINT = {
  available: "ready to run now",
  scheduled: "waiting for their time",
  executing: "running now",
  retryable: "waiting to retry",
  completed: "finished well",
  discarded: "gave up",
  cancelled: "cancelled",
};

function tile(state, n, exact) {
  return h("a", { class: ["tile", `state-${state}`], href: href("jobs", { state }), "data-count": state },
    h("span", { class: "tile-label" }, state),
    h("span", { class: "tile-value", title: exact ? null : "An estimate: the exact count would scan the table" },
      count(n, exact)),
    h("span", { class: "tile-hint" }, HINT[state]));
}

export function mount(root) {
  const tiles = h("div", { class: "tiles" });
  const charts = h("div", { class: "charts" });
  const nodes = h("p", { class: "lede" });
  root.append(h("section", { "data-view": "overview", class: "view" },
    h("div", { class: "view-head" }, h("h1", null, "Overview"), nodes),
    tiles, charts));

  async function refresh() {
    const data = await api.get("/api/overview");
    const exact = data.exact || {};
    replace(tiles, STATES.map((s) => tile(s, data.counts[s] ?? 0, exact[s] !== false)));
    replace(nodes, h("a", { href: href("nodes") }, `${data.nodes} runner node${data.nodes === 1 ? "" : "s"} alive`),
      " · counts by state now; the charts show the last hour.");
    replace(charts,
      chart({ name: "throughput", title: "Throughput", caption: "jobs finished per minute",
        points: data.series, keys: FINISHED, now: data.now }),
      chart({ name: "depth", title: "Queue depth", caption: "jobs waiting or running, stacked",
        points: data.series, keys: DEPTH, stacked: true, now: data.now }));
  }

  return { refresh };
}
