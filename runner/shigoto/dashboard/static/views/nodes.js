// Runner nodes (`#/nodes`): every live runner process, the queues it serves, what it runs now,
// and what each one leads: `leader` (pruner, rescuer) and `cron` (a runner with --cron).

import * as api from "../api.js";
import { h, replace } from "../dom.js";
import { when } from "../format.js";
import { href } from "../router.js";

function queueList(queues) {
  const entries = Object.entries(queues || {});
  if (!entries.length) return h("span", { class: "muted" }, "–");
  return entries.map(([name, limit]) => h("a", { class: "tag", href: href("jobs", { queue: name }) },
    typeof limit === "number" || typeof limit === "string" ? `${name}=${limit}` : name));
}

function row(node) {
  return h("tr", { "data-node": node.id },
    h("th", { scope: "row" }, h("code", { title: node.id }, node.id),
      (node.leads || []).map((lease) => h("span", { class: "badge leader", "data-lease": lease,
        title: lease === "cron" ? "Enqueues the cron slots" : lease === "leader" ? "Runs the leader-only services (rescue, pruning)" : `Holds the ${lease} lease` },
        lease === "leader" ? "leader" : `${lease} leader`))),
    h("td", null, node.hostname),
    h("td", { class: "num" }, node.pid),
    h("td", { class: "tags" }, queueList(node.queues)),
    h("td", { class: "num" }, node.executing),
    h("td", null, when(node.started_at)),
    h("td", null, when(node.last_seen_at)));
}

export function mount(root) {
  const body = h("div", { class: "table-wrap" }, h("p", { class: "loading" }, "Loading…"));
  root.append(h("section", { "data-view": "nodes", class: "view" },
    h("div", { class: "view-head" }, h("h1", null, "Nodes"),
      h("p", { class: "lede" }, "Live runner processes, refreshed by their heartbeat. A node that stops beating is rescued: its jobs go back to the queue.")),
    body));

  async function refresh() {
    const { nodes } = await api.get("/api/nodes");
    if (!nodes.length) {
      replace(body, h("p", { class: "empty-note", "data-empty": "" }, "No runner is alive. Start one with `shigoto run`."));
      return;
    }
    replace(body, h("table", null,
      h("thead", null, h("tr", null, ["node", "host", "pid", "queues", "executing", "started", "last seen"]
        .map((t, i) => h("th", { scope: "col", class: [2, 4].includes(i) ? "num" : null }, t)))),
      h("tbody", null, nodes.map(row))));
  }

  return { refresh };
}
