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

  // a size in words, as the server's messages say it: "1/4 GPU", "10 GiB", "MIG 1g.10gb"
  function words(offer) {
    const text = offer.display || offer.spec;
    return offer.mode === "fraction" ? `${text} GPU` : text;
  }

  function displayOf(spec) {
    const found = offersFor(spec)[0];
    return found ? words(found.offer) : spec;
  }

  const form = root.closest("form");

  // The server the form starts: JupyterHub's form posts to /hub/spawn/<user>[/<server>].
  // A refused named server's form comes back from JupyterHub as the DEFAULT server's form
  // (its SpawnHandler.post re-renders `user.spawner.get_options_form()`): its choices, its
  // quota, posted to the named server, so a second Start silently started something else.
  // FracSpawner renders the refused server's form there instead (hub/spawner.py); should a
  // form still not be its server's, Start stays off until the page is reloaded (issue 21 #5).
  function targetServer() {
    if (!form || model.server === undefined) return null;
    const path = new URL(form.getAttribute("action") || "", window.location.href).pathname;
    const match = path.match(/\/spawn\/[^/]+(?:\/([^/]+))?\/?$/);
    return match ? decodeURIComponent(match[1] || "") : null;
  }
  const target = targetServer();
  const wrongServer = target !== null && target !== model.server ? { target } : null;

  // A size chosen by the user that the chosen pool does not offer at all: only then is the pool
  // set back to "any", and it is said out loud. A refresh never changes a choice (issue 13 #1).
  function dropPoolIfNotOffered() {
    const spec = selectedGpu();
    if (!poolSelect.value || spec === "none") return;
    if (offersFor(spec).some((o) => o.pool.name === poolSelect.value)) return;
    const pool = model.pools.find((p) => p.name === poolSelect.value);
    poolSelect.value = "";
    live.textContent = `${pool ? pool.display_name : "That pool"} does not offer ${displayOf(spec)}; the pool is now “any pool”.`;
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
    userChoseMode = true;
    if (modeId === "none") {
      document.getElementById("fs-gpu-none").checked = true;
    } else if (modeOf(selectedGpu()) !== modeId) {
      // pick the first size the user can take in this mode; when there is none, fall back to
      // "no GPU" so a hidden size from another mode is never submitted behind the user's back
      const first = root.querySelector(`fieldset.fs-mode[data-mode="${modeId}"] input[name="gpu"]:not([disabled])`);
      (first || document.getElementById("fs-gpu-none")).checked = true;
      dropPoolIfNotOffered();
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
  // plain words in the summary, the technical facts (technology, SMs) on demand (issue 13 #8):
  // one element for the page's life, so its open/closed state survives every re-render
  const detailsBox = el("details", { class: "fs-details", id: "fs-details", hidden: true });
  detailsBox.appendChild(el("summary", {}, "Details"));
  const detailsList = el("ul", { class: "fs-details-list" });
  detailsBox.appendChild(detailsList);
  root.appendChild(detailsBox);
  // explicit ways out when the choice is unavailable: the user picks one, nothing switches
  const alternatives = el("div", { class: "fs-alternatives", role: "group", "aria-label": "Free instead", hidden: true });
  root.appendChild(alternatives);
  root.appendChild(staleNote);

  // A refused spawn comes back with the hub's sentence above the form (JupyterHub's banner)
  // and the refused choice still chosen, exactly as the user left it (issue 13 #2). Its reason
  // is said once, with the buttons of what is free instead (issue 38 #4: it stood in the
  // banner, under the size, in the summary and on the card, and the banner's "and 14 more
  // choices on the form" counted what the form did not show), and only while that choice
  // stays chosen. The hub's list after "Free instead:" is the buttons' list (issue 27 #7).
  const banner = document.querySelector(".spawn-error-msg");
  const checkedAtLoad = root.querySelector('input[name="gpu"]:checked');
  const refused = banner && checkedAtLoad && checkedAtLoad.value !== "none"
    ? {
      spec: checkedAtLoad.value,
      pool: poolSelect.value,
      text: banner.textContent.trim().replace(/^Error:\s*/, "").split(/\s*Free instead:/)[0],
    }
    : null;
  const refusedNote = refused ? el("p", { class: "fs-refused small mb-1", id: "fs-refused" }, `Not started: ${refused.text}`) : null;
  if (refused) {
    banner.style.display = "none"; // said by the note instead (a page without the picker keeps it)
    checkedAtLoad.setAttribute("aria-describedby", `${checkedAtLoad.getAttribute("aria-describedby") || ""} fs-refused`.trim());
  }

  function refusalStands(spec) {
    return !!refused && spec === refused.spec && poolSelect.value === refused.pool;
  }

  // the size on a pool the standing refusal is about: its own reason is the refusal's
  function saidByRefusal(spec, pool) {
    return refusalStands(selectedGpu()) && spec === refused.spec && refused.text.includes(pool.display_name);
  }

  function render() {
    const spec = selectedGpu();
    const options = spec === "none" ? [] : offersFor(spec);
    // cards are rebuilt on every change and refresh: keep keyboard focus on the same card
    const focusedPool = poolCards.contains(document.activeElement) ? document.activeElement.dataset.pool : null;
    poolCards.replaceChildren();
    if (options.length) {
      // one wording whatever is chosen, so the cards never shift when one is chosen
      const title = "Pool: choose one, or “Any pool” for the one with the most free:";
      poolCards.appendChild(el("p", { class: "fs-pool-cards-title small" }, title));
      // "any pool" is a choice of its own: pressing a chosen card never un-chooses it (a
      // form reopened on the last pool would otherwise flip to another pool, issue 21 #6)
      const any = !poolSelect.value;
      const anyCard = el("button", {
        type: "button",
        class: "fs-pool-any" + (any ? " selected" : ""),
        "aria-pressed": any ? "true" : "false",
        "data-pool": "",
      });
      anyCard.appendChild(el("span", { class: "fs-pool-name" }, "Any pool"));
      anyCard.appendChild(el("span", { class: "fs-pool-model small" }, "the one with the most free"));
      anyCard.addEventListener("click", () => {
        poolSelect.value = "";
        render();
      });
      poolCards.appendChild(anyCard);
      if (focusedPool === "") anyCard.focus();
    }
    for (const { pool, offer } of options) {
      const chosen = poolSelect.value === pool.name;
      const card = el("button", {
        type: "button",
        class: "fs-pool-card" + (chosen ? " selected" : "") + (offer.allowed ? "" : " unavailable"),
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
      if (!offer.allowed && !saidByRefusal(spec, pool)) card.appendChild(el("span", { class: "fs-reason small" }, `Unavailable: ${offer.reason}`));
      if (offer.waits) card.appendChild(el("span", { class: "fs-wait small" }, "None free now: your server would wait for one."));
      card.addEventListener("click", () => {
        if (!offer.allowed && !chosen) return; // an unavailable pool cannot be chosen
        poolSelect.value = pool.name; // pressed again: it stays chosen ("Any pool" un-pins)
        render();
      });
      poolCards.appendChild(card);
      if (focusedPool === pool.name) card.focus();
    }
    summaryLine.textContent = summaryText(spec, options);
    renderDetails(spec, options);
    renderAlternatives(spec, options);
    if (spec === "none" && currentMode !== "none" && nothingFitsAnywhere()) {
      alternatives.replaceChildren(holdersLine()); // who holds the quota, and where to stop it
      alternatives.hidden = false;
    }
    syncSizes();
    // a GPU mode with nothing the user may take: say why, and no Start into a CPU server;
    // a choice the hub would refuse (quota, access, full): no Start either, the summary says
    // why (issue 21 #3); a form that is not this server's last choice: no Start (#5)
    const emptyMode = spec === "none" && currentMode !== "none";
    const blocked = !!unavailableChoice(spec, options);
    const off = emptyMode || blocked || !!wrongServer;
    // looked up each time: this script runs inside the form, before JupyterHub's Start button
    const startButton = form ? form.querySelector('[type="submit"]') : null;
    if (startButton) {
      startButton.disabled = off;
      if (off) startButton.setAttribute("aria-describedby", "fs-summary-line");
      else startButton.removeAttribute("aria-describedby");
    }
  }

  // One source of truth (issue 21 #3): the server-rendered marks under each size (reason,
  // waiting note, disabled radio) follow the model after every refresh, as the cards do.
  // The checked radio is never disabled: a disabled radio is not submitted, and a missing
  // gpu field would start a CPU server.
  function syncSizes() {
    for (const radio of root.querySelectorAll('fieldset.fs-mode input[name="gpu"]')) {
      const found = offersFor(radio.value);
      const allowed = found.some((o) => o.offer.allowed);
      radio.disabled = !allowed && !radio.checked;
      const choice = radio.closest(".fs-choice");
      if (choice) choice.classList.toggle("fs-disabled", !allowed);
      for (const { pool, offer } of found) {
        const item = root.querySelector(`li[data-pool="${CSS.escape(pool.name)}"][data-spec="${CSS.escape(offer.spec)}"]`);
        if (!item) continue;
        let reason = item.querySelector(".fs-reason");
        if (offer.reason && !saidByRefusal(offer.spec, pool)) {
          if (!reason) {
            reason = el("span", { class: "fs-reason text-danger" });
            item.querySelector(".fs-summary").after(reason);
          }
          // a chip shows only the reasons (the pools' names are hidden in it): name the pool
          // where several pools offer the size, or their reasons read as one contradiction
          const where = found.length > 1 ? ` on ${pool.display_name}` : "";
          reason.textContent = ` (unavailable${where}: ${offer.reason})`;
        } else if (reason) {
          reason.remove();
        }
        let wait = item.querySelector(".fs-wait");
        if (offer.waits && !wait) {
          wait = el("span", { class: "fs-wait" }, " (none free now: your server would wait for one)");
          (item.querySelector(".fs-reason") || item.querySelector(".fs-summary")).after(wait);
        } else if (!offer.waits && wait) {
          wait.remove();
        }
      }
    }
  }

  // Nothing the user may use fits the quota, in any mode (issue 27 #5): the quota, not the
  // way of asking, is what stands in the way
  function nothingFitsAnywhere() {
    const offers = model.pools.filter((p) => p.allowed).flatMap((p) => p.offers);
    return offers.length > 0 && !offers.some((o) => o.allowed) && offers.some((o) => o.over_quota);
  }

  // the chosen size is unavailable (full, quota, access) on the chosen pool or on every pool
  function unavailableChoice(spec, options) {
    if (spec === "none") return null;
    const chosen = options.find((o) => o.pool.name === poolSelect.value);
    if (chosen) return chosen.offer.allowed ? null : chosen;
    if (options.some((o) => o.offer.allowed)) return null;
    return options[0] || { pool: null, offer: { reason: "No pool you may use offers it." } };
  }

  // The same list, in the same order, as the hub's refusal names after "Free instead:"
  // (choice/options.py free_elsewhere and _closeness): what the user may take and is free now,
  // the same size elsewhere first (in any unit), then the next smaller sizes, then larger ones
  // that still fit the quota; at most three (issue 27 #7: the banner and the buttons disagreed).
  function alternativesFor(spec, blocked) {
    const wanted = blocked && blocked.pool ? blocked : offersFor(spec)[0];
    const want = wanted ? wanted.offer.gpu_equivalent : null;
    const found = [];
    let order = 0;
    for (const pool of model.pools) {
      if (!pool.allowed) continue;
      for (const offer of pool.offers) {
        order += 1;
        if (!offer.allowed || !offer.free) continue;
        if (wanted && wanted.pool && wanted.pool.name === pool.name && offer.spec === spec) continue;
        let rank = [0, 0];
        if (want !== null && offer.spec !== spec && Math.abs(offer.gpu_equivalent - want) > 1e-9) {
          rank = offer.gpu_equivalent < want ? [1, want - offer.gpu_equivalent] : [2, offer.gpu_equivalent - want];
        }
        found.push({ rank, order, pool, offer });
      }
    }
    found.sort((a, b) => a.rank[0] - b.rank[0] || a.rank[1] - b.rank[1] || a.order - b.order);
    return found.slice(0, 3);
  }

  function renderAlternatives(spec, options) {
    alternatives.replaceChildren();
    const blocked = unavailableChoice(spec, options);
    const stands = refusalStands(spec);
    alternatives.hidden = !blocked && !stands;
    if (stands) alternatives.appendChild(refusedNote);
    if (!blocked) return;
    const found = alternativesFor(spec, blocked);
    if (blocked.offer.over_quota) alternatives.appendChild(holdersLine());
    if (!found.length) {
      if (!blocked.offer.over_quota) {
        alternatives.appendChild(el("p", { class: "small mb-0" }, "Nothing close to it is free for you right now; try again in a few minutes."));
      }
      return;
    }
    // counted as shown: the buttons below, not the hub's whole list
    const count = `${found.length} ${found.length === 1 ? "choice" : "choices"}`;
    alternatives.appendChild(el("p", { class: "small mb-1" }, `Free instead, ${count} close to yours (your choice stays until you pick one):`));
    for (const { pool, offer } of found) {
      const button = el("button", { type: "button", class: "btn btn-sm btn-outline-primary fs-alternative", "data-pool": pool.name, "data-spec": offer.spec },
        `${words(offer)} on ${pool.display_name} (${countText(offer)})`);
      button.addEventListener("click", () => {
        const radio = Array.from(root.querySelectorAll('input[name="gpu"]')).find((r) => r.value === offer.spec);
        if (!radio) return;
        radio.disabled = false;
        radio.checked = true;
        poolSelect.value = pool.name;
        setMode(offer.mode, false);
        currentMode = offer.mode;
        live.textContent = `Chosen: ${words(offer)} on ${pool.display_name}.`;
        render();
      });
      alternatives.appendChild(button);
    }
  }

  // "Your servers holding your quota: gpu1 (1/8 GPU). Stop one on your Home page."
  function holdersLine() {
    const line = el("p", { class: "small mb-1 fs-holders", id: "fs-holders" });
    const holders = (model.quota && model.quota.holders) || [];
    if (holders.length) {
      const names = holders.map((h) => `${h.server ? `“${h.server}”` : "your default server"} (${h.gpu_text})`);
      line.appendChild(document.createTextNode(`Your quota is held by ${names.join(", ")}. `));
    } else {
      line.appendChild(document.createTextNode("Your quota is held by your other servers. "));
    }
    if (model.home_url) {
      line.appendChild(el("a", { href: model.home_url }, "Stop a server on your Home page"));
      line.appendChild(document.createTextNode(" to free its share."));
    }
    return line;
  }

  function mostFree(usable) {
    return usable.slice().sort((a, b) => (b.offer.free ?? -1) - (a.offer.free ?? -1))[0];
  }

  // the offer the summary line describes: the chosen pool's (even when unavailable), else
  // the one "any pool" would take; null for no GPU or an empty mode
  function describedPick(spec, options) {
    if (spec === "none") return null;
    const blocked = unavailableChoice(spec, options);
    if (blocked) return blocked.pool ? blocked : null;
    const usable = options.filter((o) => o.offer.allowed);
    return usable.find((o) => o.pool.name === poolSelect.value) || mostFree(usable) || null;
  }

  function renderDetails(spec, options) {
    const pick = describedPick(spec, options);
    const lines = pick && Array.isArray(pick.offer.details) ? pick.offer.details : [];
    detailsBox.hidden = !lines.length;
    const same = lines.length === detailsList.children.length &&
      lines.every((line, i) => detailsList.children[i].textContent === String(line));
    if (same) return; // a refresh with the same facts leaves the list alone
    detailsList.replaceChildren(...lines.map((line) => el("li", {}, String(line))));
  }

  function summaryText(spec, options) {
    if (wrongServer) {
      const name = wrongServer.target ? `“${wrongServer.target}”` : "your default server";
      return `This form shows another server's last choice, not that of ${name}; reload the page to start ${name}.`;
    }
    if (spec === "none" && currentMode !== "none" && nothingFitsAnywhere()) {
      // every way to ask is over quota: say it once, not "choose another way" in circles
      const left = model.quota && model.quota.remaining_text ? ` (${model.quota.remaining_text} left)` : "";
      return `Your GPU quota is used up${left}: no size of any kind fits it. Stop a server that holds it, or choose “No GPU” for a CPU-only server.`;
    }
    if (spec === "none" && currentMode !== "none") {
      const label = (model.modes.find((m) => m.id === currentMode) || {}).label || currentMode;
      const reasons = new Set();
      for (const pool of model.pools) {
        for (const offer of pool.offers) {
          if (pool.allowed && offer.mode === currentMode && offer.reason) reasons.add(offer.reason);
        }
      }
      const why = Array.from(reasons).join(" ") || "None of its sizes is offered to you.";
      return `Nothing under “${label}” is available to you: ${why} Choose another way to ask for a GPU, or “No GPU” for a CPU-only server.`;
    }
    if (spec === "none") return "You will get: a CPU-only server (no GPU).";
    const blocked = unavailableChoice(spec, options);
    if (blocked) {
      const where = blocked.pool && poolSelect.value ? ` on ${blocked.pool.display_name}` : "";
      const next = blocked.offer.over_quota
        ? "Start is off until you stop a server or pick a size that fits."
        : "Start is off until you pick one of the free sizes below, or until one frees.";
      // a standing refusal says why below, with the buttons
      const why = refusalStands(spec) ? "." : `: ${blocked.offer.reason}`;
      return `Your choice, ${displayOf(spec)}${where}, is unavailable${why} ${next}`;
    }
    const usable = options.filter((o) => o.offer.allowed);
    let pick = usable.find((o) => o.pool.name === poolSelect.value);
    // "the pool with the most free capacity" only where there is a choice of pools (#9)
    let how = pick ? `on ${pick.pool.display_name}` : "on the pool with the most free capacity";
    if (!pick && usable.length === 1) {
      // another pool the user may use offers it too, but has none free now: not "the one pool"
      const fullElsewhere = options.some((o) => !o.offer.allowed && o.pool.allowed && !o.offer.over_quota);
      how = fullElsewhere
        ? `on ${usable[0].pool.display_name}, the one pool with one free for you now`
        : `on ${usable[0].pool.display_name}, the one pool that offers it to you`;
    }
    if (!pick) pick = mostFree(usable);
    if (!pick) return `Nothing you may take offers ${displayOf(spec)}.`;
    const queue = pick.offer.waits ? " None is free right now: your server will wait in line for one, and the next page shows how the wait goes." : "";
    return `You will get: ${pick.offer.summary} (${how}).${queue}`;
  }

  // ---- live refresh ------------------------------------------------------------------
  // What the user's servers hold can be unknown to the service (no usable pod watch and no
  // answer from the hub): it then sends used_gpu null. The picker keeps the last known numbers
  // (the page's, or a refresh that knew), says since when, and never shows a made-up 0.
  const quotaLine = document.getElementById("fs-quota");
  const quotaAsOf = el("span", { class: "fs-quota-asof small", hidden: true });
  if (quotaLine) quotaLine.appendChild(quotaAsOf);
  let quotaKnownAt = "page load";

  function usageKnown(quota) {
    return !!quota && quota.used_gpu !== null && quota.used_gpu !== undefined;
  }

  // sizes the last known quota ruled out stay ruled out, in the same words as the quota line
  // kept with them, while the service cannot tell usage (a new reason of access rules wins)
  function keepQuotaLimits(pools) {
    return pools.map((pool) => Object.assign({}, pool, {
      offers: pool.offers.map((offer) => {
        const old = offersFor(offer.spec).find((o) => o.pool.name === pool.name);
        if (!old || !old.offer.over_quota || (!offer.allowed && !offer.over_quota)) return offer;
        return Object.assign({}, offer, { allowed: false, reason: old.offer.reason, over_quota: true, waits: false });
      }),
    }));
  }

  // Under admission "wait" the hub's form knows whether its waiting line (max_waiting) is
  // full; the service does not (another process). A full size the page said cannot wait stays
  // ruled out, said as of page load, until a refresh shows one free (then nobody waits).
  function lineClosedAtLoad(next) {
    const line = model.waiting_line;
    const told = next.waiting_line;
    return !!line && line.known && line.closed && !(told && told.known);
  }

  function keepLineClosed(pools) {
    const reason = `${model.waiting_line.reason.replace(/\.$/, "")} (when this page was loaded; reload it to see whether a place has freed).`;
    return pools.map((pool) => Object.assign({}, pool, {
      offers: pool.offers.map((offer) => (offer.waits ? Object.assign({}, offer, { allowed: false, reason, waits: false }) : offer)),
    }));
  }

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
    const known = usageKnown(next.quota);
    const keep = !known && usageKnown(model.quota);
    let pools = keep ? keepQuotaLimits(next.pools) : next.pools;
    if (lineClosedAtLoad(next)) pools = keepLineClosed(pools);
    model = Object.assign({}, model, {
      pools,
      // the service does not know the user's server names: the page's list of who holds the
      // quota stays (the hub checks again at Start)
      quota: keep ? model.quota : Object.assign({ holders: (model.quota || {}).holders }, next.quota),
    });
    // the quota line shows the API's numbers of this moment, in the same words
    const used = root.querySelector(".fs-quota-used");
    const left = root.querySelector(".fs-quota-left");
    if (known) {
      if (used && next.quota.used_text) used.textContent = next.quota.used_text;
      if (left && next.quota.remaining_text) left.textContent = next.quota.remaining_text;
      quotaKnownAt = new Date().toLocaleTimeString();
    }
    quotaAsOf.hidden = !keep || model.quota.max_gpu === null || model.quota.max_gpu === undefined;
    quotaAsOf.textContent = ` As of ${quotaKnownAt}; the hub checks your quota again when you press Start.`;
    if (announce.length) live.textContent = `Availability changed. ${announce.join(". ")}.`;
  }

  // the hub's admission ("wait": a full size queues) decides how the service words full sizes
  function offersUrl() {
    const url = new URL(apiUrl, window.location.href);
    if (model.admission === "wait") url.searchParams.set("admission", "wait");
    return url.toString();
  }

  async function refresh() {
    if (!apiUrl) return;
    try {
      const response = await fetch(offersUrl(), { credentials: "same-origin", headers: { Accept: "application/json" } });
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
    if (event.target.name === "gpu") dropPoolIfNotOffered();
    if (event.target.name === "gpu" || event.target === poolSelect) render();
  });
  // One state for what is shown and what is submitted (issue 27 #1): the tabs, cards and summary
  // are derived from the checked radio and the pool select on every way into the page. The
  // browser restores form state without `change` events: on Back/Forward and reload Chromium
  // restores a form's controls once the form has finished parsing (after this script, which
  // runs inside it), and a page from the back-forward cache comes back as it was left while its
  // counts may be old. So the tab follows the radio at DOMContentLoaded, load and pageshow.
  // A GPU tab the user opened that has no size they may take shows no checked size: only an
  // untouched page goes back to "No GPU" for that reason.
  let userChoseMode = false;
  function onEntry() {
    const mode = modeOf(selectedGpu());
    if (mode !== currentMode && (mode !== "none" || !userChoseMode)) {
      currentMode = mode;
      setMode(mode, false);
    }
    dropPoolIfNotOffered();
    render();
  }
  currentMode = modeOf(selectedGpu());
  setMode(currentMode, false);
  render();
  // JupyterHub's Start button comes after this script in the page: render again once it is
  // there, so it is off from the start when the choice cannot pass (not from the first refresh)
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", onEntry);
  window.addEventListener("load", onEntry);
  window.addEventListener("pageshow", (event) => {
    onEntry();
    if (event.persisted) refresh(); // from the back-forward cache: counts of another moment
  });
  if (apiUrl) {
    refresh();
    setInterval(refresh, REFRESH_MS);
  }
})();
