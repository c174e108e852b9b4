// A group's total lag over time: uPlot over the JSON columns the console serves,
// fetched again every few seconds. Used by the consumer group page only.
(function () {
  const el = document.getElementById("lag-chart");
  if (!el || !window.uPlot) return;
  let plot = null;
  async function update() {
    let data;
    try {
      const r = await fetch(el.dataset.src, { cache: "no-store" });
      if (!r.ok) return;
      data = await r.json();
    } catch (e) {
      return; // the console went away; the next tick tries again
    }
    if (plot) {
      plot.setData(data);
      return;
    }
    plot = new uPlot(
      {
        width: Math.max(300, el.clientWidth || 800),
        height: 220,
        series: [{}, { label: "total lag", stroke: "#c62828", width: 2 }],
        axes: [{}, { size: 60 }],
      },
      data,
      el
    );
  }
  update();
  setInterval(update, 5000);
})();
