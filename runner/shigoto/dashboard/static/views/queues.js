// Queues (`#/queues`): counts by state, whether the queue is paused, its global limits, the
// runners serving it and the replicas the operator gave it; pause and resume.

import * as api from "../api.js";
import { h, replace } from "../dom.js";
import { STATES, count, when } from "../format.js";
import { href } from "../router.js";

function countCell(queue, state) {
  const n = queue.counts[state] ?? 0;
  const text = count(n, queue.exact ? queue.exact[state] !== false : true);
  return h("td", { class: ["num", n ? null : "zero"], "data-state": state },
    n ? h("a", { href: href("jobs", { queue: queue.name, state }) }, text) : text);
}

function limits(queue) {
  const parts = [];
  if (queue.global_concurrency !== null && queue.global_concurrency !== undefined) {
    parts.push(h("span", { class: "tag", title: "Global concurrency: at most this many executing across all runners" },
      `max ${queue.global_concurrency}`));
  }
  if (queue.rate_limit) parts.push(h("span", { class: "tag", title: "Rate limit" }, queue.rate_limit));
  return parts.length ? parts : h("span", { class: "muted" }, "–");
}

function replicas(queue) {
  if (queue.operator_replicas === null || queue.operator_replicas === undefined) {
    return h("span", { class: "muted", title: "No operator manages this queue" }, "–");
  }
  return [String(queue.operator_replicas), queue.operator_replicas_at
    ? h("span", { class: "muted" }, " · ", when(queue.operator_replicas_at)) : null];
}

function toggle(queue, ctx) {
  const action = queue.paused ? "resume" : "pause";
  const session = ctx.session();
  return h("button", {
    type: "button", "data-action": action, disabled: !session.actions_enabled,
    title: session.actions_enabled ? null : "Actions are disabled on this dashboard",
    onclick: (event) => {
      event.currentTarget.disabled = true;
      ctx.act(`/api/queues/${encodeURIComponent(queue.name)}/${action}`,
        `Queue ${queue.name}: ${queue.paused ? "resumed" : "paused"}`);
    },
  }, queue.paused ? "Resume" : "Pause");
}

function row(queue, ctx) {
  return h("tr", { "data-queue": queue.name, "data-paused": String(queue.paused) },
    h("th", { scope: "row" }, h("a", { href: href("jobs", { queue: queue.name }) }, queue.name),
      queue.paused ? h("span", { class: "badge paused", "data-field": "paused" }, "paused") : null),
    STATES.map((state) => countCell(queue, state)),
    h("td", null, limits(queue)),
    h("td", { class: "num", "data-field": "runners" }, queue.runners),
    h("td", { class: "num" }, replicas(queue)),
    h("td", { class: "row-actions" }, toggle(queue, ctx)));
}

export function mount(root, route, ctx) {
  const body = h("div", { class: "table-wrap" }, h("p", { class: "loading" }, "Loading…"));
  root.append(h("section", { "data-view": "queues", class: "view" },
    h("div", { class: "view-head" }, h("h1", null, "Queues"),
      h("p", { class: "lede" }, "Every queue with jobs, settings or a live runner. A paused queue keeps its jobs; no runner claims them until it is resumed.")),
    body));

  async function refresh() {
    const { queues } = await api.get("/api/queues");
    if (!queues.length) {
      replace(body, h("p", { class: "empty-note", "data-empty": "" }, "No queues yet: enqueue a job or start a runner."));
      return;
    }
    replace(body, h("table", { class: "queues" },
      h("thead", null, h("tr", null,
        h("th", { scope: "col" }, "queue"),
        STATES.map((s) => h("th", { scope: "col", class: "num" }, s)),
        h("th", { scope: "col" }, "limits"),
        h("th", { scope: "col", class: "num" }, "runners"),
        h("th", { scope: "col", class: "num" }, "replicas"),
        h("th", { scope: "col" }, h("span", { class: "visually-hidden" }, "actions")))),
      h("tbody", null, queues.map((q) => row(q, ctx)))));
  }

  return { refresh };
}
