// Small glue for the console's pages; the vendored htmx and uPlot do the real work.
"use strict";

// A live chart: <div data-chart="/url.json" data-every="2" data-series="key:label:color,...">.
// The endpoint answers {"t": [unix seconds...], key: [values...], ...}; the chart polls it
// every data-every seconds and redraws in place.
function rilletChart(el) {
  if (el.dataset.started) return;
  el.dataset.started = "1";
  const series = el.dataset.series.split(",").map((s) => {
    const [key, label, stroke] = s.split(":");
    return { key, label, stroke };
  });
  const every = Math.max(1, parseFloat(el.dataset.every || "2")) * 1000;
  const width = () => Math.max(300, (el.clientWidth || 800) - 12); // inside the padding
  let plot = null;
  async function tick() {
    if (!document.body.contains(el)) return; // the page moved on
    try {
      const response = await fetch(el.dataset.chart, { cache: "no-store" });
      if (response.ok) {
        const d = await response.json();
        const data = [d.t, ...series.map((s) => d[s.key] || [])];
        if (plot === null) {
          plot = new uPlot(
            {
              width: width(),
              height: 150,
              scales: { y: { range: (u, lo, hi) => [0, Math.max(1, hi)] } },
              series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.stroke, width: 2 }))],
              axes: [{}, { incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000, 10000] }],
            },
            data,
            el,
          );
          el.dataset.ready = "1";
        } else {
          plot.setData(data);
        }
        el.dataset.points = String(d.t.length);
        // The newest value of each series, for a quick look (and the browser tests).
        series.forEach((s) => {
          const values = d[s.key] || [];
          el.setAttribute(`data-last-${s.key.replace(/_/g, "-")}`, String(values[values.length - 1] ?? ""));
        });
      }
    } catch (e) {
      // The console restarting or the network blinking: try again next tick.
    }
    setTimeout(tick, every);
  }
  tick();
}

function rilletStart(root) {
  root.querySelectorAll("[data-chart]").forEach(rilletChart);
}

document.addEventListener("DOMContentLoaded", () => rilletStart(document));
document.addEventListener("htmx:afterSettle", (e) => rilletStart(e.target));
