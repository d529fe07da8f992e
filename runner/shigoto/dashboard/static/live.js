// Live updates: the server sends `change` over /api/events when the counts move; the page then
// re-fetches what it shows. When the stream fails (a proxy that buffers, a server restart), the
// page polls every five seconds instead, and goes back to the stream once it opens again.

import { url } from "./api.js";

const POLL_MS = 5000;
/** A stream the server refused is not retried by the browser: open a new one this much later. */
const REOPEN_MS = 30000;

/**
 * Call `onChange` whenever something may have changed; `onMode` hears "live", "polling" or
 * "connecting". Returns a function that stops everything.
 */
export function follow(onChange, onMode = () => {}) {
  let timer = null;
  let source = null;
  let reopen = null;
  let missed = false; // the stream was down: what changed meanwhile was not announced

  const poll = (on) => {
    if (on && timer === null) timer = window.setInterval(onChange, POLL_MS);
    if (!on && timer !== null) {
      window.clearInterval(timer);
      timer = null;
    }
  };

  const open = () => {
    source = new EventSource(url("/api/events"));
    source.addEventListener("open", () => {
      poll(false);
      onMode("live");
      if (missed) onChange();
      missed = false;
    });
    source.addEventListener("change", () => onChange());
    source.addEventListener("error", () => {
      missed = true;
      poll(true);
      onMode("polling");
      if (source.readyState === EventSource.CLOSED) reopen = window.setTimeout(open, REOPEN_MS);
    });
  };

  if (typeof window.EventSource !== "function") {
    poll(true);
    onMode("polling");
  } else {
    onMode("connecting");
    open();
  }
  return () => {
    poll(false);
    window.clearTimeout(reopen);
    if (source) source.close();
  };
}
