// strictq's operator dashboard: refresh the panels, and run an action after its confirmation.
// Actions call the gateway's admin routes with the session cookie and the page's CSRF token
// (gateway/dashboard_session.py); nothing else is sent anywhere.
"use strict";
(() => {
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  const panels = document.getElementById("panels");
  const dialog = document.getElementById("confirm");
  const form = document.getElementById("confirm-form");
  const flash = document.getElementById("flash");
  const every = Number(panels.dataset.refresh || "5") * 1000;
  let pending = null;

  function say(text, ok) {
    flash.textContent = text;
    flash.className = ok ? "ok" : "failed";
  }

  async function refresh() {
    if (dialog.open) return;
    try {
      const answer = await fetch("/dashboard/panels", {
        headers: { "X-Strictq-CSRF": csrf }, credentials: "same-origin", cache: "no-store",
      });
      if (answer.status === 401) { window.location.assign("/dashboard"); return; }
      if (answer.ok) panels.innerHTML = await answer.text();
    } catch (err) {
      say("The gateway does not answer: " + err, false);
    }
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-path]");
    if (!button) return;
    pending = { ...button.dataset };
    document.getElementById("confirm-title").textContent = pending.title;
    const wanted = (pending.fields || "").split(" ").filter(Boolean);
    for (const field of form.querySelectorAll(".field")) {
      const shown = wanted.includes(field.dataset.field);
      field.hidden = !shown;
      const input = field.querySelector("input, select");
      input.required = shown && input.name === "reason";
      if (input.tagName === "INPUT") input.value = "";
    }
    dialog.returnValue = "";  // Escape keeps the last value: never a stale "confirm"
    dialog.showModal();
  });

  dialog.addEventListener("close", async () => {
    const action = pending;
    pending = null;
    if (dialog.returnValue !== "confirm" || action === null) return;
    const wanted = (action.fields || "").split(" ").filter(Boolean);
    const body = {};
    for (const name of wanted) {
      const value = form.elements[name].value;
      if (name === "ttl") { if (value) body.ttl = Number(value); } else body[name] = value;
    }
    const init = { method: action.method, credentials: "same-origin", headers: { "X-Strictq-CSRF": csrf } };
    if (wanted.length) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    try {
      const answer = await fetch(action.path, init);
      const text = await answer.text();
      let detail = text;
      try { const doc = JSON.parse(text); detail = doc.error ? doc.error.message : ""; } catch (_) { /* not JSON */ }
      if (answer.ok) say(action.title.replace(/\?.*$/, "") + ": done", true);
      else say(action.title.replace(/\?.*$/, "") + ": refused (" + answer.status + ") " + detail, false);
    } catch (err) {
      say("The gateway does not answer: " + err, false);
    }
    await refresh();
  });

  if (every > 0) window.setInterval(refresh, every);
})();
