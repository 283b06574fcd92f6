// The admin page's charts: one uPlot per pool (held, free, idle-held GPU-equivalents over the
// last 24 h), from the JSON the page carries. uPlot is vendored beside this file (uplot/,
// MIT licence kept): no CDN, the page works offline. Every chart has a table behind it.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("fs-history").textContent || "{}");
  const dark = () => document.documentElement.dataset.bsTheme === "dark";
  // colours that keep 3:1 against both themes' backgrounds; dashes tell the lines apart too
  const palette = () =>
    dark()
      ? { held: "#6ea8fe", free: "#75b798", idle: "#ffda6a", axis: "#dee2e6", grid: "#495057" }
      : { held: "#0b5ed7", free: "#146c43", idle: "#997404", axis: "#212529", grid: "#dee2e6" };

  function options(width) {
    const c = palette();
    const axis = { stroke: c.axis, grid: { stroke: c.grid, width: 1 }, ticks: { stroke: c.grid } };
    return {
      width: width,
      height: 180,
      scales: { x: { time: true }, y: { range: (u, min, max) => [0, Math.max(1, max)] } },
      axes: [axis, Object.assign({ label: "GPUs", size: 50 }, axis)],
      series: [
        {},
        { label: "Held", stroke: c.held, width: 2 },
        { label: "Free", stroke: c.free, width: 2, dash: [6, 4] },
        { label: "Idle, held", stroke: c.idle, width: 2, dash: [2, 3] },
      ],
    };
  }

  function columns(samples) {
    const cols = [[], [], [], []];
    for (const s of samples) {
      for (let i = 0; i < 4; i++) cols[i].push(s[i] === null ? null : s[i]);
    }
    return cols;
  }

  const charts = [];
  function draw() {
    for (const chart of charts.splice(0)) chart.destroy();
    for (const el of document.querySelectorAll(".fs-chart")) {
      el.textContent = "";
      const samples = data[el.dataset.pool] || [];
      const width = Math.max(el.clientWidth || 300, 240);
      if (typeof uPlot === "undefined") {
        el.textContent = "The chart could not load; its table is below.";
        continue;
      }
      charts.push(new uPlot(options(width), columns(samples), el));
      el.dataset.drawn = String(samples.length);
    }
  }
  draw();
  // the hub's darkmode.js sets the theme (the navigation's toggle, or the browser's change):
  // redraw in its colours
  new MutationObserver(draw).observe(document.documentElement, {
    attributes: true,
    attributeFilter: ["data-bs-theme"],
  });
  let pending = 0;
  window.addEventListener("resize", () => {
    clearTimeout(pending);
    pending = setTimeout(draw, 200);
  });
})();
