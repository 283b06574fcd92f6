/* fracspawner GPU picker: progressive enhancement of the server-rendered spawn form.
 *
 * The form works without this script: radios named `gpu`, selects named `pool` and `image`.
 * This script only adds mode tabs, pool cards with live free/total badges, a summary line and
 * live refresh from the fracspawner service. It submits the very same fields. It never uses
 * innerHTML with data: every string from the model goes in through textContent.
 */
(function () {
  "use strict";

  const root = document.getElementById("fracspawner-picker");
  if (!root || root.dataset.enhanced) return;
  root.dataset.enhanced = "1";
  const modelEl = document.getElementById("fracspawner-model");
  let model;
  try {
    model = JSON.parse(modelEl.textContent);
  } catch (e) {
    return; // the plain form still works
  }
  const apiUrl = root.dataset.apiUrl;
  const REFRESH_MS = Number(root.dataset.refreshMs || 10000);
  const live = document.getElementById("fs-live");
  const poolSelect = document.getElementById("fs-pool");
  const gpuFieldset = root.querySelector("fieldset.fs-gpu");
  const modeSets = Array.from(root.querySelectorAll("fieldset.fs-mode"));
  let lastUpdated = new Date();
  let stale = false;
  // the service answered, but its own watch of the cluster is down: its counts are frozen
  let serverStale = !!model.stale;

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      node.setAttribute(k, v === true ? "" : String(v));
    }
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function offersFor(spec) {
    const result = [];
    for (const pool of model.pools) {
      for (const offer of pool.offers) {
        if (offer.spec === spec) result.push({ pool, offer });
      }
    }
    return result;
  }

  function countText(offer) {
    if (offer.free === null || offer.free === undefined) return "availability unknown";
    return `${offer.free} of ${offer.total} free`;
  }

  function selectedGpu() {
    const checked = root.querySelector('input[name="gpu"]:checked');
    return checked ? checked.value : "none";
  }

  // ---- mode tabs ---------------------------------------------------------------------
  const modes = [{ id: "none", label: "No GPU" }].concat(model.modes);
  const tabs = el("div", { class: "fs-modes", role: "radiogroup", "aria-label": "How to ask for a GPU" });
  const tabButtons = {};
  for (const mode of modes) {
    const button = el("button", { type: "button", class: "fs-mode-tab", role: "radio", "data-mode": mode.id, "aria-checked": "false" }, mode.label);
    button.addEventListener("click", () => setMode(mode.id, true));
    button.addEventListener("keydown", (event) => {
      const ids = modes.map((m) => m.id);
      const i = ids.indexOf(mode.id);
      let next = null;
      if (event.key === "ArrowRight" || event.key === "ArrowDown") next = ids[(i + 1) % ids.length];
      if (event.key === "ArrowLeft" || event.key === "ArrowUp") next = ids[(i - 1 + ids.length) % ids.length];
      if (next) {
        event.preventDefault();
        setMode(next, true);
        tabButtons[next].focus();
      }
    });
    tabButtons[mode.id] = button;
    tabs.appendChild(button);
  }
  gpuFieldset.insertBefore(tabs, gpuFieldset.querySelector(".fs-choice"));
  const noneChoice = document.getElementById("fs-gpu-none").closest(".fs-choice");

  function modeOf(spec) {
    if (spec === "none") return "none";
    const found = offersFor(spec)[0];
    return found ? found.offer.mode : "none";
  }

  let currentMode = "none";

  function setMode(modeId, userAction) {
    for (const [id, button] of Object.entries(tabButtons)) {
      const on = id === modeId;
      button.setAttribute("aria-checked", on ? "true" : "false");
      button.tabIndex = on ? 0 : -1;
      button.classList.toggle("active", on);
    }
    noneChoice.hidden = modeId !== "none";
    for (const set of modeSets) set.hidden = set.dataset.mode !== modeId;
    if (!userAction) return;
    if (modeId === "none") {
      document.getElementById("fs-gpu-none").checked = true;
    } else if (modeOf(selectedGpu()) !== modeId) {
      // pick the first size the user can take in this mode; when there is none, fall back to
      // "no GPU" so a hidden size from another mode is never submitted behind the user's back
      const first = root.querySelector(`fieldset.fs-mode[data-mode="${modeId}"] input[name="gpu"]:not([disabled])`);
      (first || document.getElementById("fs-gpu-none")).checked = true;
    }
    currentMode = modeId;
    render();
  }

  // ---- pool cards + summary ---------------------------------------------------------
  const poolCards = el("div", { class: "fs-pool-cards", role: "group", "aria-label": "Pools that can serve your choice" });
  poolSelect.closest("div").before(poolCards);
  const summaryLine = el("p", { class: "fs-summary-line", id: "fs-summary-line", "aria-live": "polite" });
  const staleNote = el("p", { class: "fs-stale small", hidden: true });
  root.appendChild(summaryLine);
  root.appendChild(staleNote);

  function render() {
    const spec = selectedGpu();
    const options = spec === "none" ? [] : offersFor(spec);
    // a pool chosen for an earlier size may not serve this one: the server would refuse it
    if (poolSelect.value && !options.some((o) => o.pool.name === poolSelect.value && o.offer.allowed)) {
      poolSelect.value = "";
    }
    // cards are rebuilt on every change and refresh: keep keyboard focus on the same card
    const focusedPool = poolCards.contains(document.activeElement) ? document.activeElement.dataset.pool : null;
    poolCards.replaceChildren();
    if (options.length) poolCards.appendChild(el("p", { class: "fs-pool-cards-title small" }, "Pools that can serve it:"));
    for (const { pool, offer } of options) {
      const chosen = poolSelect.value === pool.name;
      const card = el("button", {
        type: "button",
        class: "fs-pool-card" + (chosen ? " selected" : ""),
        "aria-pressed": chosen ? "true" : "false",
        "aria-disabled": offer.allowed ? null : "true",
        "data-pool": pool.name,
      });
      card.appendChild(el("span", { class: "fs-pool-name" }, pool.display_name));
      card.appendChild(el("span", { class: "fs-pool-model small" }, `${pool.gpu_model} · ${pool.backend_name}`));
      const free = offer.free;
      const badgeClass = free === null || free === undefined ? "unknown" : free > 0 ? "free" : "full";
      const badge = el("span", { class: `fs-badge fs-badge-${badgeClass}` });
      badge.appendChild(el("span", { "aria-hidden": "true" }, badgeClass === "free" ? "● " : badgeClass === "full" ? "○ " : "? "));
      badge.appendChild(document.createTextNode(countText(offer) + (stale || serverStale ? " (stale)" : "")));
      card.appendChild(badge);
      if (!offer.allowed) card.appendChild(el("span", { class: "fs-reason small" }, offer.reason));
      card.addEventListener("click", () => {
        if (!offer.allowed) return;
        poolSelect.value = chosen ? "" : pool.name;
        render();
      });
      poolCards.appendChild(card);
      if (focusedPool === pool.name) card.focus();
    }
    summaryLine.textContent = summaryText(spec, options);
  }

  function summaryText(spec, options) {
    if (spec === "none" && currentMode !== "none") {
      const label = (model.modes.find((m) => m.id === currentMode) || {}).label || currentMode;
      return `Nothing under “${label}” is available to you (the reason is under each size). Start now gives a CPU-only server.`;
    }
    if (spec === "none") return "You will get: a CPU-only server (no GPU).";
    const usable = options.filter((o) => o.offer.allowed);
    let pick = usable.find((o) => o.pool.name === poolSelect.value);
    let how = pick ? `on ${pick.pool.display_name}` : "on the pool with the most free capacity";
    if (!pick) {
      pick = usable.slice().sort((a, b) => (b.offer.free ?? -1) - (a.offer.free ?? -1))[0];
    }
    if (!pick) return `Nothing you may take offers ${spec}.`;
    return `You will get: ${pick.offer.summary} (${how}).`;
  }

  // ---- live refresh ------------------------------------------------------------------
  function applyModel(next) {
    const announce = [];
    const spec = selectedGpu();
    for (const pool of next.pools) {
      for (const offer of pool.offers) {
        const old = offersFor(offer.spec).find((o) => o.pool.name === pool.name);
        if (old && offer.spec === spec && old.offer.free !== offer.free) {
          announce.push(`${pool.display_name}: ${countText(offer)}`);
        }
        for (const span of root.querySelectorAll(".fs-count")) {
          if (span.dataset.pool === pool.name && span.dataset.spec === offer.spec) {
            span.textContent = countText(offer);
          }
        }
      }
    }
    model = Object.assign({}, model, { pools: next.pools, quota: next.quota });
    if (announce.length) live.textContent = `Availability changed. ${announce.join(". ")}.`;
  }

  async function refresh() {
    if (!apiUrl) return;
    try {
      const response = await fetch(apiUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const next = await response.json();
      if (!next || !Array.isArray(next.pools)) throw new Error("bad payload");
      applyModel(next);
      serverStale = !!next.stale;
      const frozen = document.getElementById("fs-stale-counts");
      if (frozen) {
        frozen.hidden = !serverStale;
        frozen.textContent = `Counts may be out of date: the cluster has not answered for ${next.stale_seconds || 0} s.`;
      }
      lastUpdated = new Date();
      if (stale) live.textContent = "Live availability is back.";
      stale = false;
      staleNote.hidden = true;
    } catch (e) {
      if (!stale) live.textContent = "Live availability is unavailable; showing the last known counts.";
      stale = true;
      staleNote.hidden = false;
      staleNote.textContent = `Live counts unavailable: showing counts from ${lastUpdated.toLocaleTimeString()} (stale).`;
    }
    render();
  }

  root.addEventListener("change", (event) => {
    if (event.target.name === "gpu" || event.target === poolSelect) render();
  });
  currentMode = modeOf(selectedGpu());
  setMode(currentMode, false);
  render();
  if (apiUrl) {
    refresh();
    setInterval(refresh, REFRESH_MS);
  }
})();
