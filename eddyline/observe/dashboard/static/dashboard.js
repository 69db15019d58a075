// Polls /api/view and swaps in the sections the server drew; sends control calls.
"use strict";
let epoch = -1, state = "";
const token = () => document.getElementById("c-token").value || sessionStorage.getItem("eddyline-token") || "";

async function refresh() {
  try {
    const r = await fetch(`api/view?since=${epoch}&state=${encodeURIComponent(state)}`, {credentials: "same-origin"});
    if (!r.ok) { document.getElementById("status").textContent = `dashboard: ${r.status} ${r.statusText}`; return; }
    const v = await r.json();
    epoch = v.epoch; state = v.state;
    for (const [id, html] of Object.entries(v.sections)) {
      const el = document.getElementById(id);
      if (el) el.innerHTML = html;
    }
  } catch (e) {
    document.getElementById("status").textContent = "dashboard: the driver does not answer (stopped?)";
  }
}

async function control(action, body) {
  const out = document.getElementById("control-result");
  const headers = {"Content-Type": "application/json"};
  if (token()) { headers["Authorization"] = `Bearer ${token()}`; sessionStorage.setItem("eddyline-token", token()); }
  const r = await fetch(`api/control/${action}`, {method: "POST", headers, body: JSON.stringify(body || {})});
  const v = await r.json().catch(() => ({}));
  out.className = r.ok ? "dim" : "error";
  out.textContent = r.ok ? `queued ${v.id}: ${v.queued} (${v.note})`
                         : `refused (${r.status}): ${typeof v.detail === "string" ? v.detail : JSON.stringify(v.detail)}`;
  state = "";  // redraw the control calls
  refresh();
}

const val = id => document.getElementById(id).value.trim();
const on = (id, f) => document.getElementById(id).addEventListener("click", f);
on("b-rebalance", () => control("rebalance", {step: val("c-step")}));
on("b-rescale", () => control("rescale", {step: val("c-step"), lanes: Number(val("c-lanes"))}));
on("b-move", () => {
  const move = {};
  for (const part of val("c-move").split(",").filter(Boolean)) { const [kg, lane] = part.split(":"); move[kg.trim()] = Number(lane); }
  control("move", {step: val("c-step"), move});
});
on("b-set", () => {
  const text = val("c-set"), i = text.indexOf("=");
  let value = text.slice(i + 1).trim();
  if (value !== "" && !isNaN(Number(value))) value = Number(value);
  control("set", {settings: {[text.slice(0, i).trim()]: value}});
});
on("b-pause", () => control("pause"));
on("b-resume", () => control("resume"));
// the URL the server printed carries the token: kept for this tab (control calls send it as a
// header; reads use the cookie the server set) and taken out of the address bar and history
const given = new URLSearchParams(location.search).get("token");
if (given) { sessionStorage.setItem("eddyline-token", given); history.replaceState(null, "", location.pathname); }
refresh();
setInterval(refresh, 1000);
