// The table of jobs shared by the jobs page, the failures page and a job's parents and
// children. One row per job, `tr[data-job-id]`, its state in `td[data-field="state"]`.

import { h } from "../dom.js";
import { badge, shortWorker, when } from "../format.js";
import { href } from "../router.js";

const ARGS_PREVIEW = 80;

/** Why args are not shown, in a few words, for each `args_hidden` value. */
export const HIDDEN_ARGS = {
  encrypted: "encrypted",
  token: "sign in to see",
  never: "hidden",
};

function argsPreview(job) {
  if (job.args_hidden) {
    return h("span", { class: "muted", title: `args ${HIDDEN_ARGS[job.args_hidden] || job.args_hidden}` },
      `‹${HIDDEN_ARGS[job.args_hidden] || job.args_hidden}›`);
  }
  const text = JSON.stringify(job.args ?? {});
  const short = text.length > ARGS_PREVIEW ? `${text.slice(0, ARGS_PREVIEW - 1)}…` : text;
  return h("code", { class: "args", title: text.length > ARGS_PREVIEW ? text : null }, short);
}

/** "2/5", or "2" when the job carries no limit of its own (its worker's default applies). */
export function attempts(job) {
  return job.max_attempts === null || job.max_attempts === undefined
    ? String(job.attempt) : `${job.attempt}/${job.max_attempts}`;
}

function tags(job) {
  return (job.tags || []).map((tag) => h("span", { class: "tag" }, tag));
}

/** The time that matters most for a job in its state. */
function moment(job, now) {
  if (job.finished_at) return [`${job.state} `, when(job.finished_at, now)];
  if (job.state === "executing") return ["started ", when(job.attempted_at, now)];
  if (job.state === "scheduled" || job.state === "retryable") return ["due ", when(job.scheduled_at, now)];
  return ["inserted ", when(job.inserted_at, now)];
}

function row(job, now) {
  return h("tr", { "data-job-id": job.id, class: job.archived ? "archived" : null },
    h("td", { class: "num" }, h("a", { href: href("job", { id: job.id }) }, `#${job.id}`)),
    h("td", { "data-field": "state" }, badge(job.state)),
    h("td", null, h("a", { href: href("jobs", { queue: job.queue }) }, job.queue)),
    h("td", null, shortWorker(job.worker)),
    h("td", { class: "args-cell" }, argsPreview(job)),
    h("td", { class: "num" }, attempts(job)),
    h("td", { class: "tags" }, tags(job), job.archived ? h("span", { class: "tag archived" }, "archived") : null),
    h("td", { class: "when" }, moment(job, now)),
  );
}

/** A table of `jobs`, or a line saying there are none. */
export function jobTable(jobs, { empty = "No jobs match." } = {}) {
  if (!jobs.length) return h("p", { class: "empty-note", "data-empty": "" }, empty);
  const now = new Date();
  return h("div", { class: "table-wrap" }, h("table", { class: "jobs" },
    h("thead", null, h("tr", null,
      ["id", "state", "queue", "worker", "args", "attempt", "tags", "when"].map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", null, jobs.map((job) => row(job, now)))));
}
