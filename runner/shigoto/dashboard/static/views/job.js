// One job (`#/jobs/<id>`): its state and actions, args, result, errors with tracebacks,
// progress, meta, and the parents and children of its workflow. Sealed (encrypted) values are
// never opened by the dashboard; args are shown only as the server's show_args allows, and a
// viewer without the token gets no results, error messages, meta, tags or keys (the server
// names each field it took out in `job.hidden`).

import * as api from "../api.js";
import { h, replace } from "../dom.js";
import { FINISHED, badge, exact, json, when } from "../format.js";
import { href } from "../router.js";
import { HIDDEN_ARGS, jobTable } from "./job_table.js";

/** Which action each state allows, as the server decides it (409 otherwise). */
export function allowed(action, state) {
  if (action === "retry") return ["discarded", "cancelled", "completed", "retryable"].includes(state);
  if (action === "cancel") return !FINISHED.includes(state);
  if (action === "delete") return FINISHED.includes(state);
  return false;
}

const WHY_NOT = {
  retry: "Only a discarded, cancelled, completed or retryable job can be retried",
  cancel: "A finished job cannot be cancelled",
  delete: "Only a finished job can be deleted",
};

const ARGS_NOTE = {
  encrypted: "Encrypted: the dashboard never opens sealed args.",
  token: "Hidden until you sign in with the dashboard token.",
  never: "Hidden: this dashboard runs with --show-args never.",
};

function block(title, fieldName, ...content) {
  return h("section", { class: "card", "data-field": fieldName }, h("h2", null, title), ...content);
}

function pre(value) {
  return h("pre", { class: "code" }, json(value));
}

const SIGN_IN_NOTE = "Hidden until you sign in with the dashboard token.";

function isHidden(job, name) {
  return (job.hidden || []).includes(name);
}

/** A fact's value, or "hidden" when the server kept it from this viewer. */
function fact(job, name, value) {
  return isHidden(job, name) ? h("span", { class: "muted", "data-hidden": "token" }, "hidden") : value;
}

function argsBlock(job) {
  if (job.args_hidden) {
    return block("Args", "args", h("p", { class: "muted", "data-hidden": job.args_hidden },
      ARGS_NOTE[job.args_hidden] || `Hidden (${HIDDEN_ARGS[job.args_hidden] || job.args_hidden}).`));
  }
  return block("Args", "args", pre(job.args ?? {}));
}

function resultBlock(job) {
  if (job.result_sealed || job.sealed) return block("Result", "result", h("p", { class: "muted" }, "Encrypted: not shown."));
  if (isHidden(job, "result")) return block("Result", "result", h("p", { class: "muted", "data-hidden": "token" }, SIGN_IN_NOTE));
  if (job.result === null || job.result === undefined) {
    return block("Result", "result", h("p", { class: "muted" }, job.finished_at ? "None." : "No result yet."));
  }
  return block("Result", "result", pre(job.result));
}

/**
 * The frame that raised, as "file:line in function": the last frame of the traceback's last
 * exception. Shown above the traceback, so the line to look at is above the fold however deep
 * the stack (runners store tracebacks from the user's first frame: Shigoto's are omitted).
 */
export function raisedAt(traceback) {
  const frames = [...String(traceback || "").matchAll(/^ {2}File "([^"]+)", line (\d+), in (.+)$/gm)];
  const last = frames.at(-1);
  return last ? `${last[1]}:${last[2]} in ${last[3]}` : null;
}

function errorItem(error, latest) {
  const where = raisedAt(error.traceback);
  const detail = error.traceback
    ? h("details", { open: latest }, h("summary", null, "Traceback"), h("pre", { class: "code traceback" }, error.traceback))
    : null;
  return h("li", { class: "error-entry" },
    h("div", { class: "error-head" },
      h("strong", null, `Attempt ${error.attempt}`), " · ", when(error.at),
      error.sealed ? h("span", { class: "muted" }, " · encrypted") : null),
    h("p", { class: "error-text" }, error.error ?? error.error_class ?? (error.sealed ? "Encrypted: not shown." : "")),
    where ? h("p", { class: "error-where", "data-raised-at": "" }, "Raised at ", h("code", null, where)) : null,
    detail);
}

function errorsBlock(job) {
  const errors = [...(job.errors || [])].reverse();
  if (!errors.length) return block("Errors", "errors", h("p", { class: "muted" }, "No errors."));
  return block(`Errors (${errors.length})`, "errors",
    h("ol", { class: "errors", reversed: true }, errors.map((e, i) => errorItem(e, i === 0))));
}

function progressBlock(job) {
  if (isHidden(job, "progress") || job.progress === null || job.progress === undefined) return null;
  const value = Math.max(0, Math.min(100, Number(job.progress)));
  return h("div", { class: "progress-line", "data-field": "progress" },
    h("progress", { max: 100, value }), h("span", null, `${value}%`));
}

function facts(job) {
  const rows = [
    ["Queue", h("a", { href: href("jobs", { queue: job.queue }) }, job.queue)],
    ["Worker", h("code", null, job.worker)],
    ["Priority", fact(job, "priority", job.priority)],
    ["Attempt", job.max_attempts === null || job.max_attempts === undefined
      ? `${job.attempt} (limit: the worker's own)` : `${job.attempt} of ${job.max_attempts}`],
    ["Tags", fact(job, "tags", (job.tags || []).length ? job.tags.map((t) => h("span", { class: "tag" }, t)) : "–")],
    ["Inserted", exact(job.inserted_at)],
    ["Scheduled", exact(job.scheduled_at)],
    ["Attempted", exact(job.attempted_at)],
    ["Finished", exact(job.finished_at)],
    ["Attempted by", job.attempted_by || "–"],
    ...(job.cancel_requested_at && job.state === "executing"
      ? [["Cancel requested", `${exact(job.cancel_requested_at)}: its runner is stopping it`]]
      : []),
    ["Unique key", fact(job, "unique_key", job.unique_key ?? "–")],
    ["Partition key", fact(job, "partition_key", job.partition_key ?? "–")],
    ["Batch", job.batch_id ?? "–"],
    ["Archived", job.archived ? "yes (moved to the archive table)" : "no"],
  ];
  return h("dl", { class: "facts" }, rows.flatMap(([k, v]) => [h("dt", null, k), h("dd", null, v)]));
}

/** The buttons; `pending` remembers a delete awaiting its second click across live redraws. */
function actions(job, ctx, pending, onDeleted) {
  const session = ctx.session();
  const buttons = ["retry", "cancel", "delete"].map((action) => {
    const ok = allowed(action, job.state);
    const button = h("button", {
      type: "button", "data-action": action, class: action === "delete" ? "danger" : null,
      disabled: !ok || !session.actions_enabled,
      title: !session.actions_enabled ? "Actions are disabled on this dashboard" : ok ? null : WHY_NOT[action],
    }, action === "delete" && pending.delete ? "Delete for good?" : action[0].toUpperCase() + action.slice(1));
    button.addEventListener("click", async () => {
      if (action === "delete" && !pending.delete) {
        pending.delete = true;
        button.textContent = "Delete for good?";
        return;
      }
      pending.delete = false;
      button.disabled = true;
      const answer = await ctx.act(`/api/jobs/${job.id}/${action}`,
        `Job ${job.id}: ${{ retry: "retried", cancel: "cancelled", delete: "deleted" }[action]}`);
      if (answer && action === "delete") onDeleted();
    });
    return button;
  });
  return h("div", { class: "actions" }, buttons);
}

function relatives(title, fieldName, list) {
  if (!list || !list.length) return null;
  return h("section", { class: "card", "data-field": fieldName }, h("h2", null, title), jobTable(list));
}

export function mount(root, route, ctx) {
  const section = h("section", { "data-view": "job", class: "view", "data-job": route.id },
    h("p", { class: "loading" }, "Loading…"));
  root.append(section);
  const gone = () => ctx.navigate(href("jobs"));
  const pending = { delete: false };

  async function refresh() {
    let answer;
    try {
      answer = await api.get(`/api/jobs/${route.id}`);
    } catch (error) {
      if (error instanceof api.ApiError && error.status === 404) {
        replace(section, h("div", { class: "view-head" }, h("h1", null, `Job ${route.id}`)),
          h("p", { class: "notice", "data-missing": "" }, "No such job: it was deleted, or its archive retention ran out."),
          h("p", null, h("a", { href: href("jobs") }, "Back to the jobs")));
        return;
      }
      throw error;
    }
    const job = answer.job;
    section.dataset.state = job.state;
    // A failing job is looked at for its errors: they come first.
    const failing = ["discarded", "retryable"].includes(job.state);
    replace(section,
      h("div", { class: "view-head job-head" },
        h("h1", null, `Job #${job.id} `, h("span", { class: "worker-name" }, job.worker.split(".").pop())),
        h("span", { "data-field": "state" }, badge(job.state)),
        actions(job, ctx, pending, gone)),
      progressBlock(job),
      failing ? errorsBlock(job) : null,
      h("div", { class: "job-grid" },
        h("section", { class: "card" }, h("h2", null, "Details"), facts(job)),
        h("div", { class: "stack" }, argsBlock(job), resultBlock(job),
          block("Meta", "meta", isHidden(job, "meta")
            ? h("p", { class: "muted", "data-hidden": "token" }, SIGN_IN_NOTE) : pre(job.meta || {})))),
      failing ? null : errorsBlock(job),
      relatives("Parents (runs after these)", "parents", answer.parents),
      relatives("Children (run after this one)", "children", answer.children));
  }

  return { refresh };
}
