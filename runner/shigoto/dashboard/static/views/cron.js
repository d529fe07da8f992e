// Cron schedules (`#/cron`): each schedule's expression and worker, its next slot, the last
// slot it enqueued, and the job that slot produced.

import * as api from "../api.js";
import { h, replace } from "../dom.js";
import { badge, shortWorker, when } from "../format.js";
import { href } from "../router.js";

function lastJob(schedule) {
  if (!schedule.last_job) return h("span", { class: "muted" }, "–");
  return [h("a", { href: href("job", { id: schedule.last_job.id }) }, `#${schedule.last_job.id}`), " ",
    badge(schedule.last_job.state)];
}

function row(schedule) {
  return h("tr", { "data-cron": schedule.name },
    h("th", { scope: "row" }, schedule.name,
      schedule.paused ? h("span", { class: "badge paused" }, "paused") : null,
      schedule.unscheduled ? h("span", { class: "badge unscheduled", "data-unscheduled": "",
        title: "No live process holds a cron lease: start a runner with --cron" }, "not firing") : null),
    h("td", { "data-field": "expression" }, h("code", null, schedule.expression)),
    h("td", { "data-field": "worker" }, shortWorker(schedule.worker)),
    h("td", { "data-field": "queue" }, h("a", { href: href("jobs", { queue: schedule.queue }) }, schedule.queue)),
    h("td", { "data-field": "timezone" }, schedule.timezone || "UTC"),
    h("td", { "data-field": "next" }, schedule.paused ? h("span", { class: "muted" }, "paused") : when(schedule.next_at)),
    h("td", { "data-field": "last-slot" }, when(schedule.last_slot_at)),
    h("td", { "data-field": "last-job" }, lastJob(schedule)));
}

export function mount(root) {
  const body = h("div", { class: "table-wrap" }, h("p", { class: "loading" }, "Loading…"));
  root.append(h("section", { "data-view": "cron", class: "view" },
    h("div", { class: "view-head" }, h("h1", null, "Cron"),
      h("p", { class: "lede" }, "Schedules the cron leader (a runner started with --cron, or the operator) enqueues, exactly once per slot.")),
    body));

  async function refresh() {
    const { schedules } = await api.get("/api/cron");
    if (!schedules.length) {
      replace(body, h("p", { class: "empty-note", "data-empty": "" }, "No cron schedules. Runners register them from their --cron options or the operator's CronSchedule resources."));
      return;
    }
    replace(body, h("table", null,
      h("thead", null, h("tr", null, ["name", "expression", "worker", "queue", "time zone", "next slot", "last slot", "last job"]
        .map((t) => h("th", { scope: "col" }, t)))),
      h("tbody", null, schedules.map(row))));
  }

  return { refresh };
}
