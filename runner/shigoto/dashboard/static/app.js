// The dashboard's shell: session and sign-in, the flash message, the router that mounts one
// view at a time, and live updates that ask the current view to refresh itself.
//
// A view module exports `mount(root, route, ctx)` and returns `{refresh}`; it builds its
// element under `root` and re-fetches its data when `refresh` is called. The shell makes sure
// two refreshes of the same view never overlap; a late answer for a view already left draws
// into that view's own element, which is no longer in the page.

import * as api from "./api.js";
import { h, replace } from "./dom.js";
import { follow } from "./live.js";
import { parse, section } from "./router.js";
import * as cron from "./views/cron.js";
import * as job from "./views/job.js";
import * as jobs from "./views/jobs.js";
import * as nodes from "./views/nodes.js";
import * as overview from "./views/overview.js";
import * as queues from "./views/queues.js";

const VIEWS = {
  overview, queues, jobs, failures: jobs, job, cron, nodes,
};

const main = document.getElementById("main");
const flashBox = document.querySelector("[data-flash]");
const signInForm = document.querySelector("[data-sign-in]");
const signedIn = document.querySelector("[data-signed-in]");
const liveBadge = document.querySelector("[data-live]");

let session = { authenticated: false, actions_enabled: false, show_args: "token", databases: [] };
let current = null; // {route, view, busy, again}

// -- flash messages ----------------------------------------------------------------------------

/** Say how the last action went; `kind` is "ok" or "error". Stays until the next one. */
function flash(message, kind = "ok") {
  flashBox.hidden = false;
  flashBox.className = `flash ${kind}`;
  flashBox.dataset.kind = kind;
  replace(flashBox, h("span", { class: "flash-text" }, message),
    h("button", { type: "button", class: "flash-close", "aria-label": "Dismiss",
      onclick: () => { flashBox.hidden = true; } }));
}

/** The sentence to show for a refused action. */
function refusal(error) {
  if (error.status === 401) return `Sign in first: ${error.message}`;
  if (error.status === 403) return `Not allowed: ${error.message}`;
  if (error.status === 409) return `Not possible now: ${error.message}`;
  if (error.status === 404) return `Not found: ${error.message}`;
  return error.message || "The request failed";
}

/**
 * Run a POST action and report it: a success message, or the server's reason. The current
 * view refreshes either way, so the page shows what the database now holds.
 */
async function act(path, success) {
  try {
    const answer = await api.post(path);
    flash(typeof success === "function" ? success(answer) : success, "ok");
    return answer;
  } catch (error) {
    flash(error instanceof api.ApiError ? refusal(error) : `Request failed: ${error.message}`,
      "error");
    return null;
  } finally {
    refresh();
  }
}

// -- session and sign-in -------------------------------------------------------------------------

function showSession() {
  const readOnly = !session.actions_enabled;
  signInForm.hidden = session.authenticated || readOnly;
  signedIn.hidden = !session.authenticated;
  document.body.dataset.authenticated = String(session.authenticated);
  document.body.dataset.actions = session.actions_enabled ? "enabled" : "disabled";
  const mode = document.querySelector("[data-mode]");
  mode.textContent = readOnly
    ? "Read-only: start the dashboard with SHIGOTO_DASHBOARD_TOKEN or --token-file to enable actions"
    : session.authenticated ? "Actions enabled" : "Sign in with the token to retry, cancel, delete or pause";
  document.querySelector("[data-version]").textContent = session.version ? `Shigoto ${session.version}` : "";
  showDatabases();
}

function showDatabases() {
  const label = document.querySelector(".database");
  const select = label.querySelector("select");
  const names = session.databases || [];
  label.hidden = names.length < 2;
  if (label.hidden) return;
  const chosen = api.database() || "default";
  replace(select, names.map((name) => h("option", { value: name, selected: name === chosen }, name)));
}

async function loadSession() {
  session = await api.get("/api/session");
  if (api.token() && !session.authenticated) {
    api.clearToken(); // the server no longer takes it (restarted with another token)
    flash("The saved token is no longer accepted: sign in again", "error");
  }
  showSession();
}

async function signIn(event) {
  event.preventDefault();
  const input = signInForm.elements.token;
  const candidate = input.value.trim();
  if (!candidate) {
    flash("Enter the dashboard token to sign in", "error");
    return;
  }
  try {
    const answer = await api.get("/api/session", {}, { bearer: candidate });
    if (!answer.authenticated) {
      flash("Sign-in failed: the dashboard refused this token", "error");
      input.select();
      return;
    }
    api.setToken(candidate);
    input.value = "";
    session = answer;
    showSession();
    flash("Signed in: actions are enabled", "ok");
    refresh();
  } catch (error) {
    flash(`Sign-in failed: ${error.message}`, "error");
  }
}

function signOut() {
  api.clearToken();
  session = { ...session, authenticated: false };
  showSession();
  flash("Signed out", "ok");
  refresh();
}

// -- views ---------------------------------------------------------------------------------------

function context() {
  return {
    session: () => session,
    act,
    flash,
    refresh,
    navigate: (hash) => { window.location.hash = hash; },
  };
}

function showNav(route) {
  const active = section(route);
  for (const link of document.querySelectorAll("a[data-nav]")) {
    const on = link.dataset.nav === active;
    link.classList.toggle("active", on);
    if (on) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

function problem(error) {
  const text = error instanceof api.ApiError ? error.message : `Cannot reach the dashboard: ${error.message}`;
  let notice = main.querySelector(":scope > .notice.problem");
  if (!notice) {
    notice = h("p", { class: "notice problem error", role: "alert" });
    main.prepend(notice);
  }
  notice.textContent = text;
}

function clearProblem() {
  const notice = main.querySelector(":scope > .notice.problem");
  if (notice) notice.remove();
}

/** Mark the view as drawn from the server's data (`data-loaded`), for scripts and tests. */
function loaded() {
  const section = main.querySelector(":scope > [data-view]");
  if (section) section.dataset.loaded = "true";
}

/** Re-fetch the current view; a refresh asked for while one runs happens right after it. */
async function refresh() {
  const view = current;
  if (!view) return;
  if (view.busy) {
    view.again = true;
    return;
  }
  view.busy = true;
  try {
    do {
      view.again = false;
      try {
        await view.view.refresh();
        if (view === current) {
          clearProblem();
          loaded();
        }
      } catch (error) {
        if (view === current && error.name !== "AbortError") problem(error);
      }
    } while (view.again && view === current);
  } finally {
    view.busy = false;
  }
}

function navigate() {
  const route = parse(window.location.hash);
  showNav(route);
  const module = VIEWS[route.name];
  const root = replace(main);
  const view = module.mount(root, route, context());
  current = { route, view, busy: false, again: false };
  document.title = `${route.name === "job" ? `Job ${route.id}` : route.name[0].toUpperCase() + route.name.slice(1)} · Shigoto`;
  refresh();
}

function showLive(mode) {
  liveBadge.dataset.live = mode;
  liveBadge.textContent = { live: "live", polling: "polling every 5 s", connecting: "connecting" }[mode] || mode;
}

async function start() {
  signInForm.addEventListener("submit", signIn);
  document.querySelector('[data-action="sign-out"]').addEventListener("click", signOut);
  document.querySelector(".database select").addEventListener("change", (event) => {
    const params = new URLSearchParams(window.location.search);
    if (event.target.value === "default") params.delete("db");
    else params.set("db", event.target.value);
    const query = params.toString();
    window.location.search = query ? `?${query}` : "";
  });
  try {
    await loadSession();
  } catch (error) {
    problem(error);
  }
  window.addEventListener("hashchange", navigate);
  navigate();
  follow(refresh, showLive);
}

start();
