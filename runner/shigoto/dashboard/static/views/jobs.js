// The jobs page (`#/jobs?queue=&worker=&state=&tag=&args=&after=&limit=`) and the failures
// page (`#/failures`, the same list fixed to state "failed": discarded and retryable jobs). Pages are keyset
// pages: `after` is the server's opaque cursor, so "next" never skips or repeats a job even
// while jobs are inserted; "first" goes back to the newest. The filter form is built once per
// visit and only the table is redrawn on live updates, so typing is never interrupted.
// An args filter has no index: the server searches a bounded stretch of ids per page and may
// answer a short or empty page with `partial` and `scanned_to_id`; the page then says how far
// it searched, and "next" (the server's `next`, never the page's length) carries on below.

import * as api from "../api.js";
import { h, replace } from "../dom.js";
import { STATES } from "../format.js";
import { href } from "../router.js";
import { jobTable } from "./job_table.js";

const FILTERS = ["queue", "worker", "state", "tag", "args"];
const LABELS = {
  queue: "Queue", worker: "Worker", state: "State", tag: "Tag", args: "Args contain", limit: "Per page",
};
const LIMITS = ["50", "100", "500"];
// "failed" is the one word for discarded and retryable jobs, accepted by the server as by
// `shigoto jobs list --state failed` and `shigoto retry --state failed` (docs/jobs.md).
const FAILED = "failed";

function field(name, label, control, hint) {
  return h("label", { class: "field" }, h("span", { class: "field-label" }, label), control,
    hint ? h("span", { class: "field-hint" }, hint) : null);
}

function stateSelect(value) {
  const options = [["", "any state"], ...STATES.map((s) => [s, s]), [FAILED, "failed (discarded or retryable)"]];
  const known = options.some(([v]) => v === (value || ""));
  if (!known) options.push([value, value]);
  return h("select", { name: "state" },
    options.map(([v, text]) => h("option", { value: v, selected: v === (value || "") }, text)));
}

function filterForm(params, failures, onSubmit) {
  const input = (name, placeholder) => h("input", {
    name, value: params[name] || "", placeholder, autocomplete: "off", spellcheck: "false",
  });
  return h("form", { class: "filters", "data-filter": "", onsubmit: onSubmit },
    field("queue", LABELS.queue, input("queue", "any")),
    field("worker", LABELS.worker, input("worker", "any")),
    failures ? null : field("state", LABELS.state, stateSelect(params.state)),
    field("tag", LABELS.tag, input("tag", "any")),
    field("args", LABELS.args, input("args", '{"user_id": 42}')),
    field("limit", LABELS.limit, h("select", { name: "limit" },
      LIMITS.map((n) => h("option", { value: n, selected: n === (params.limit || "50") }, n)))),
    h("div", { class: "filter-buttons" },
      h("button", { type: "submit", class: "primary" }, "Filter"),
      h("a", { class: "button", href: href(failures ? "failures" : "jobs") }, "Clear")));
}

function formParams(form, failures) {
  const data = new FormData(form);
  const params = {};
  for (const name of [...FILTERS, "limit"]) {
    const value = String(data.get(name) ?? "").trim();
    if (value && !(failures && name === "state")) params[name] = value;
  }
  if (params.limit === "50") delete params.limit;
  return params;
}

function markInvalid(form, error) {
  for (const input of form.querySelectorAll("[aria-invalid]")) input.removeAttribute("aria-invalid");
  const target = error && error.field ? form.elements[error.field] : null;
  if (target) target.setAttribute("aria-invalid", "true");
}

/** The query the API gets for a route's params. */
export function query(params, failures) {
  const q = {};
  for (const name of FILTERS) if (params[name]) q[name] = params[name];
  if (failures) q.state = FAILED;
  q.limit = params.limit || "50";
  if (params.after) q.after = params.after;
  return q;
}

export function mount(root, route, ctx) {
  const failures = route.name === "failures";
  const page = route.name;
  const params = route.params;
  const number = Number(params.page || 1);
  const onSubmit = (event) => {
    event.preventDefault();
    ctx.navigate(href(page, formParams(event.target, failures)));
  };
  const form = filterForm(params, failures, onSubmit);
  const table = h("div", { class: "job-list" });
  const first = h("button", { type: "button", "data-page": "first", disabled: !params.after,
    onclick: () => ctx.navigate(href(page, { ...params, after: null, page: null })) }, "« Newest");
  const next = h("button", { type: "button", "data-page": "next", disabled: true }, "Older »");
  const where = h("span", { class: "page-number" }, `Page ${number}`);
  const scanned = h("p", { class: "empty-note", "data-scan-note": "", hidden: true });
  const section = h("section", { "data-view": page, class: "view" },
    h("div", { class: "view-head" },
      h("h1", null, failures ? "Failures" : "Jobs"),
      h("p", { class: "lede" }, failures
        ? "Jobs that failed: discarded ones ran out of attempts or were discarded; retryable ones wait for another attempt."
        : "Newest first. Filters combine; args match jobs whose args contain the given JSON object.")),
    form, table, scanned,
    h("nav", { class: "pager", "aria-label": "Pages" }, first, where, next));
  root.append(section);

  async function refresh() {
    let answer;
    try {
      answer = await api.get("/api/jobs", query(params, failures));
      markInvalid(form, null);
    } catch (error) {
      // A filter the server refuses (400 bad value, 403 args filter while args are hidden).
      if (error instanceof api.ApiError && (error.status === 400 || (error.status === 403 && error.field))) {
        markInvalid(form, error);
        const label = LABELS[error.field];
        replace(table, h("p", { class: "notice error", "data-filter-error": "" },
          label ? `${label}: ${error.message}` : error.message));
        next.disabled = true;
        scanned.hidden = true;
        return;
      }
      throw error;
    }
    const partial = Boolean(answer.partial && answer.next);
    replace(table, jobTable(answer.jobs, {
      empty: partial ? "No matches among the jobs searched for this page."
        : failures ? "No failed jobs." : params.after ? "No older jobs." : "No jobs match these filters.",
    }));
    scanned.hidden = !partial;
    scanned.dataset.scannedTo = partial ? String(answer.scanned_to_id) : "";
    replace(scanned, partial
      ? `Searched jobs down to #${answer.scanned_to_id}: args filters search a stretch of jobs per page. “Search older »” carries on.`
      : null);
    next.textContent = partial ? "Search older »" : "Older »";
    table.dataset.after = params.after || "";
    table.dataset.count = String(answer.jobs.length);
    next.disabled = !answer.next;
    next.dataset.cursor = answer.next || "";
    next.onclick = answer.next
      ? () => ctx.navigate(href(page, { ...params, after: answer.next, page: number + 1 }))
      : null;
  }

  return { refresh };
}
