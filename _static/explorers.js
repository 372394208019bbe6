/* The book's static explorers (each explorer's module in attention/explorers/ writes
 * its data into the page through site.Explorer).
 *
 * Each <div class="static-explorer"> holds JSON: the controls' grids, Vega-Lite specs and
 * the numbers attention.memory (or attention.hard, attention.core, ...) computed when the
 * chapter executed. This script builds native controls, looks the chosen rows up and
 * hands them to Vega (vega-bundle.js, vendored from vl-convert-python). It runs no
 * attention algorithm and no simulation. What it does compute from the looked-up
 * numbers, all of it arithmetic on them:
 *   - bytes = elements x bytes per element (Traffic.bytes), sums over tensors (totals,
 *     the S and P share), ratios of two totals, and N / P tokens per device;
 *   - decode's step time ESTIMATE = bytes / the GPU's peak HBM bandwidth (Python sends
 *     both), the same division memory.roofline_ms makes;
 *   - unit changes: fixed-point weights back to fractions (/ 10^4 sampling, / 1000
 *     masks), the online softmax's acc / l, histogram bin edges from (lo, hi, bins),
 *     and per-level averages of the sampling weights;
 *   - the flat-grid indices of the chosen settings (row-major, as the grids document).
 *   - the sparse explorer's keys read: the lengths of the chosen blocks, summed.
 * Series are read by name (the grids name them), never by the order of a Python dict.
 * window.staticExplorers[id] exposes each explorer (state, Vega views) to the site tests.
 */
(function () {
  "use strict";

  const KINDS = {};
  window.staticExplorers = window.staticExplorers || {};

  // ------------------------------------------------------------------ helpers
  const fmtInt = (x) => Number(x).toLocaleString("en-US");
  // One rounding rule with attention.plots.human_bytes: three significant digits, a tie
  // rounded up (toPrecision, on the exact double), trailing zeros dropped, no exponent.
  function human(bytes) {
    const units = [[2 ** 40, "TiB"], [2 ** 30, "GiB"], [2 ** 20, "MiB"], [2 ** 10, "KiB"]];
    for (const [div, name] of units) {
      if (bytes >= div) return String(Number((bytes / div).toPrecision(3))) + " " + name;
    }
    return Math.trunc(bytes) + " B";
  }
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]));
  const sum = (a) => a.reduce((x, y) => x + y, 0);

  /** Rows for bars_spec: one per (group, tensor, read/written) with elements > 0. */
  function barRows(group, tensors, flat, bpe, rows) {
    tensors.forEach((t, k) => {
      const r = flat[2 * k], w = flat[2 * k + 1];
      if (r) rows.push({ group, tensor: t, kind: "read", elements: r, bytes: r * bpe, order: 2 * k });
      if (w) rows.push({ group, tensor: t, kind: "written", elements: w, bytes: w * bpe, order: 2 * k + 1 });
    });
    return rows;
  }
  /** Total elements of a flattened [r0, w0, r1, w1, ...] list (its first 2 * n entries). */
  const totalOf = (flat, n) => sum(flat.slice(0, 2 * n));

  /** A Vega-Lite spec with each named data source ({name}) given its values. */
  function withData(spec, data) {
    const visit = (node) => {
      if (node && node.data && node.data.name in data) node.data.values = data[node.data.name];
      (node.layer || []).forEach(visit);
    };
    visit(spec);
    return spec;
  }

  // ------------------------------------------------------------------ controls
  let uid = 0;
  function makeControl(host, spec, onChange) {
    const id = "se-" + (++uid) + "-" + spec.name;
    const wrap = document.createElement("div");
    wrap.className = "se-control se-" + spec.type;
    const label = document.createElement("label");
    label.htmlFor = id;
    label.textContent = spec.label;
    let input;
    if (spec.type === "select") {
      input = document.createElement("select");
      spec.options.forEach((o, i) => {
        const opt = document.createElement("option");
        opt.value = String(i);
        opt.textContent = o;
        input.append(opt);
      });
      input.value = String(spec.value);
    } else if (spec.type === "checkbox") {
      input = document.createElement("input");
      input.type = "checkbox";
      input.checked = !!spec.value;
    } else {
      input = document.createElement("input");
      input.type = "range";
      input.min = "0";
      input.step = "1";
      input.max = String(spec.options.length - 1);
      input.value = String(spec.value);
    }
    input.id = id;
    input.name = spec.name;
    input.dataset.name = spec.name;
    const out = document.createElement("output");
    out.htmlFor = id;
    wrap.append(label, input);
    if (spec.type === "range") wrap.append(out);
    if (spec.type === "checkbox") wrap.insertBefore(input, label);
    host.append(wrap);
    const ctl = {
      spec, input, out,
      get() {
        return spec.type === "checkbox" ? input.checked : Number(input.value);
      },
      setOptions(options) {
        spec.options = options;
        input.max = String(options.length - 1);
        if (Number(input.value) > options.length - 1) input.value = String(options.length - 1);
        ctl.show();
      },
      show() {
        if (spec.type === "range") {
          const text = spec.options[Number(input.value)];
          out.textContent = text;
          input.setAttribute("aria-valuetext", spec.label + " " + text);
        }
      },
    };
    ctl.show();
    input.addEventListener(spec.type === "range" ? "input" : "change", () => {
      ctl.show();
      onChange(spec.name);
    });
    return ctl;
  }

  // ------------------------------------------------------------------ the engine
  async function init(root) {
    const script = root.querySelector("script.static-explorer-data");
    if (!script || root.dataset.ready) return;
    root.dataset.ready = "1";
    const cfg = JSON.parse(script.textContent);
    const kind = KINDS[cfg.kind];
    const fallback = root.querySelector(".static-explorer-fallback");
    if (!kind || typeof vegaEmbed === "undefined") {
      if (fallback) fallback.textContent = "This explorer could not start (no Vega in this page).";
      return;
    }
    if (fallback) fallback.remove();
    const form = document.createElement("div");
    form.className = "se-controls";
    const readout = document.createElement("div");
    readout.className = "se-readout";
    readout.setAttribute("aria-live", "polite");
    const charts = document.createElement("div");
    charts.className = "se-charts";
    root.append(form, readout, charts);

    const handle = { id: root.id, kind: cfg.kind, cfg, controls: {}, views: {}, specKeys: {},
                     lastRedrawMs: null, redraws: 0, ready: null };
    window.staticExplorers[root.id] = handle;
    const slots = {};
    for (const name of kind.charts) {
      const div = document.createElement("div");
      div.className = "se-chart se-chart-" + name;
      charts.append(div);
      slots[name] = div;
    }
    let pending = Promise.resolve();
    const redraw = (changed) => {
      pending = pending.then(() => draw(changed));
      handle.ready = pending;
      return pending;
    };
    for (const spec of kind.controls(cfg)) {
      handle.controls[spec.name] = makeControl(form, spec, redraw);
    }
    handle.state = () => Object.fromEntries(
      Object.entries(handle.controls).map(([k, c]) => [k, c.get()]));
    /** Set a control by option index (or checked state) through its own DOM event. */
    handle.set = (name, value) => {
      const c = handle.controls[name];
      if (c.spec.type === "checkbox") c.input.checked = !!value;
      else c.input.value = String(value);
      c.input.dispatchEvent(new Event(c.spec.type === "range" ? "input" : "change"));
      return handle.ready;
    };

    async function draw(changed) {
      const t0 = performance.now();
      const out = kind.update(cfg, handle.state(), handle, changed);
      const runs = [];
      for (const [name, chart] of Object.entries(out.charts)) {
        if (handle.specKeys[name] !== chart.spec) {
          if (handle.views[name]) handle.views[name].finalize();
          // The first data go into the spec, so the first draw already has them.
          const spec = withData(JSON.parse(JSON.stringify(cfg.specs[chart.spec])), chart.data);
          const res = await vegaEmbed(slots[name], spec, { actions: false, renderer: "svg" });
          handle.views[name] = res.view;
          handle.specKeys[name] = chart.spec;
          continue;
        }
        const view = handle.views[name];
        for (const [ds, rows] of Object.entries(chart.data)) view.data(ds, rows);
        runs.push(view.runAsync());
      }
      readout.innerHTML = out.text;
      await Promise.all(runs);
      handle.lastRedrawMs = performance.now() - t0;
      handle.redraws += 1;
    }
    await redraw(null);
  }

  function initAll() {
    document.querySelectorAll(".static-explorer").forEach((root) => {
      init(root).catch((err) => {
        root.append(Object.assign(document.createElement("p"), {
          className: "se-error", textContent: "Explorer error: " + err }));
        console.error(err);
      });
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", initAll);
  else initAll();

  const labels = (xs, f) => xs.map(f || String);
  /** Control specs: a slider or a drop-down over xs (shown through f), a checkbox. */
  const slider = (name, label, xs, value, f) => ({ name, label, type: "range", options: labels(xs, f), value });
  const select = (name, label, xs, value, f) => ({ name, label, type: "select", options: labels(xs, f), value });
  const checkbox = (name, label, value) => ({ name, label, type: "checkbox", value });
  const dtypeName = (t) => `${t[0]} (${t[1]} B)`;

  /** Several algorithms over the same tensors T: bars (one group each) and a readout part
   *  at index `at` of xs, and a line of total bytes over xs. runs: [{ group, series, flat }],
   *  flat(i) the [r0, w0, r1, w1, ...] counts at xs[i]. */
  function compare(runs, T, bpe, xs, at) {
    const rows = [], lines = [], parts = [];
    for (const { group, series, flat } of runs) {
      const here = flat(at);
      barRows(group, T, here, bpe, rows);
      parts.push(`${group} <b>${human(totalOf(here, T.length) * bpe)}</b>`);
      xs.forEach((x, i) => lines.push({ x, series, bytes: totalOf(flat(i), T.length) * bpe }));
    }
    return { rows, lines, parts };
  }
  /** update()'s charts: lines with a rule at x, and the bars. */
  const linesAndBars = (lines, x, rows) => ({
    lines: { spec: "lines", data: { lines, marker: [{ x }] } },
    bars: { spec: "bars", data: { bars: rows } },
  });

  // ------------------------------------------------------------------ chapter 2: tiles
  KINDS.tile = {
    charts: ["bars", "tiles"],
    controls: ({ grid: g, init, srams, dtypes, groups }) => [
      slider("N", "sequence length N", g.N, init.N, fmtInt), select("d", "head dim d", g.d, init.d),
      slider("Br", "query tile Br", g.B, init.Br), slider("Bc", "key tile Bc", g.B, init.Bc),
      select("sram", "SRAM per SM", srams, init.sram, (s) => s[0]),
      select("dtype", "dtype", dtypes, init.dtype, dtypeName),
      select("algorithm", "algorithm", groups.fwd.concat(groups.bwd), init.algorithm),
      slider("step", "schedule step", ["1"], 0)],
    update(cfg, s, h) {
      const g = cfg.grid, nd = g.d.length, nb = g.B.length;
      const algs = cfg.groups.fwd.concat(cfg.groups.bwd);
      const alg = algs[s.algorithm];
      const group = cfg.groups.fwd.includes(alg) ? "fwd" : "bwd";
      const idx = ((s.N * nd + s.d) * nb + s.Br) * nb + s.Bc;
      const bpe = cfg.dtypes[s.dtype][1];
      const M = cfg.sram.M[s.sram][s.dtype];
      const rows = [];
      const lines = [];
      // The compulsory traffic (memory.compulsory, computed in Python): one tick per bar.
      const comp = cfg.compulsory, floor = [];
      for (const a of cfg.groups[group]) {
        const flat = g.counts[a][idx], nt = g.tensors[a].length;
        barRows(a, g.tensors[a], flat, bpe, rows);
        const once = comp.counts[a][s.N * nd + s.d][0];
        floor.push({ group: a, what: comp.label, elements: once, bytes: once * bpe });
        const peak = flat[flat.length - 1];
        const fits = peak <= M;
        lines.push(`<li${a === alg ? ' class="se-chosen"' : ""}><b>${a}</b>: ${human(totalOf(flat, nt) * bpe)} ` +
          `(${fmtInt(totalOf(flat, nt))} elements); tiles need ${fmtInt(peak)} elements of SRAM: ` +
          (fits ? "fit" : '<span class="se-bad">do NOT fit in M</span>') +
          `; compulsory ${human(once * bpe)} (${fmtInt(once)} elements)</li>`);
      }
      // The schedule at the small N of the step view.
      const run = cfg.schedule.runs[`${alg},${g.B[s.Br]},${g.B[s.Bc]}`];
      const step = h.controls.step;
      const nSteps = run.steps.length;
      if (step.spec.options.length !== nSteps) {
        step.setOptions(Array.from({ length: nSteps }, (_, i) => `${i + 1} of ${nSteps}`));
      }
      const cur = Math.min(step.get(), nSteps - 1);
      const tiles = [];
      const fill = [];
      for (let i = 0; i < run.tr; i++) { fill.push(new Array(run.tc).fill(null)); }
      for (let k = 0; k <= cur; k++) {
        const [i, j, what] = run.steps[k];
        if (i < 0) continue;
        const cols = j >= 0 ? [j] : [...Array(run.tc).keys()];
        for (const c of cols) fill[i][c] = [what, k === cur];
      }
      for (let i = 0; i < run.tr; i++) {
        for (let j = 0; j < run.tc; j++) {
          const f = fill[i][j];
          tiles.push({ i, j, fill: f ? f[0] : "pending", current: f ? f[1] : false });
        }
      }
      const [, , , loads, stores] = run.steps[cur];
      const rule = cfg.sram.rule[`${s.sram},${s.dtype},${s.d},${s.N}`];
      const text =
        `<p>N = ${fmtInt(g.N[s.N])}, d = ${g.d[s.d]}, Br = ${g.B[s.Br]}, Bc = ${g.B[s.Bc]}, ` +
        `${cfg.dtypes[s.dtype][0]}; SRAM ${esc(cfg.srams[s.sram][0])}: M = ${fmtInt(M)} elements.</p>` +
        `<ul>${lines.join("")}</ul>` +
        `<p>Bars: the simulated traffic, every re-read of a block from HBM (no L2). Black ticks: ` +
        `the compulsory traffic, each tensor crossing HBM once, the lower bound that an L2 ` +
        `holding the re-reads gets near.</p>` +
        `<p>FA1's rule for this M and d: Bc = ⌈M/4d⌉ = ${rule[1]}, Br = min(⌈M/4d⌉, d) = ${rule[0]}; ` +
        `its flash1 tiles need ${fmtInt(rule[2])} elements (${rule[2] <= M ? "fit" : "do NOT fit: the rule holds up to constants"}).</p>` +
        `<p class="se-step"><b>${alg}</b>, schedule at N = ${cfg.schedule.N} (${run.tr} × ${run.tc} tiles), ` +
        `step ${cur + 1} of ${nSteps}: load ${esc(loads)}; store ${esc(stores)}.</p>`;
      return {
        charts: { bars: { spec: "bars_" + group, data: { bars: rows, compulsory: floor } },
                  tiles: { spec: "tiles", data: { tiles } } },
        text,
      };
    },
  };

  // ------------------------------------------------------------------ landing page teaser
  KINDS.teaser = {
    charts: ["bars"],
    controls: ({ grid: g, init }) => [
      slider("N", "sequence length N", g.N, init.N, fmtInt),
      slider("Br", "query tile Br", g.B, init.Br), slider("Bc", "key tile Bc", g.B, init.Bc)],
    update(cfg, s) {
      const g = cfg.grid, nb = g.B.length;
      const idx = ((s.N * 1 + 0) * nb + s.Br) * nb + s.Bc;
      const names = { standard: "standard attention", flash2: "FlashAttention-2" };
      const rows = [], tot = {}, once = {}, floor = [];
      const comp = cfg.compulsory;
      for (const a of ["standard", "flash2"]) {
        const flat = g.counts[a][idx];
        barRows(names[a], g.tensors[a], flat, cfg.bpe, rows);
        tot[a] = totalOf(flat, g.tensors[a].length) * cfg.bpe;
        // memory.compulsory (computed in Python), each tensor crossing HBM once
        once[a] = comp.counts[a][s.N][0] * cfg.bpe;
        floor.push({ group: names[a], what: comp.label, elements: comp.counts[a][s.N][0], bytes: once[a] });
      }
      const text = `<p>One head, N = ${fmtInt(g.N[s.N])}, d = ${g.d[0]}, ${cfg.dtype}: standard attention moves ` +
        `<b>${human(tot.standard)}</b> between HBM and SRAM, FlashAttention-2 <b>${human(tot.flash2)}</b> ` +
        `(${(tot.standard / tot.flash2).toFixed(1)} times less). With an L2 cache that holds the re-read tiles, ` +
        `HBM sees nearer the compulsory bytes (black ticks): ${human(once.standard)} against ` +
        `${human(once.flash2)}, since standard attention still writes S and P and reads them back.</p>`;
      return { charts: { bars: { spec: "bars", data: { bars: rows, compulsory: floor } } }, text };
    },
  };

  // ------------------------------------------------------------------ chapter 1
  KINDS.naive = {
    charts: ["lines", "bars"],
    controls: ({ grid: g, init, dtypes }) => [
      slider("n", "keys n", g.n, init.n, fmtInt), checkbox("self", "self-attention (m = n)", init.self),
      slider("m", "queries m", g.m, init.m, fmtInt), select("d", "head dim d", g.d, init.d),
      select("dtype", "dtype", dtypes, init.dtype, dtypeName)],
    update(cfg, s, h) {
      const g = cfg.grid, T = g.tensors, bpe = cfg.dtypes[s.dtype][1];
      h.controls.m.input.disabled = s.self;
      const table = g.counts[s.self ? 0 : s.m + 1][s.d];
      const lines = [];
      g.n.forEach((n, ni) => {
        const flat = table[ni];
        T.forEach((t, k) => lines.push({ x: n, series: t, bytes: (flat[2 * k] + flat[2 * k + 1]) * bpe }));
        lines.push({ x: n, series: "total", bytes: totalOf(flat, T.length) * bpe });
      });
      const flat = table[s.n];
      const rows = [];
      T.forEach((t, k) => barRows(t, [t], [flat[2 * k], flat[2 * k + 1]], bpe, rows));
      const total = totalOf(flat, T.length);
      const sp = flat[2 * T.indexOf("S")] + flat[2 * T.indexOf("S") + 1] + flat[2 * T.indexOf("P")] + flat[2 * T.indexOf("P") + 1];
      const m = s.self ? g.n[s.n] : g.m[s.m];
      const text = `<p>m = ${fmtInt(m)} queries, n = ${fmtInt(g.n[s.n])} keys, d = ${g.d[s.d]}, ` +
        `${cfg.dtypes[s.dtype][0]} (Br = ${g.Br}): <b>${human(total * bpe)}</b> in all, ` +
        `${Math.round((100 * sp) / total)}% of it S and P.</p>`;
      return { charts: linesAndBars(lines, g.n[s.n], rows), text };
    },
  };

  // ------------------------------------------------------------------ chapter 3
  KINDS.temperature = {
    charts: ["map", "row"],
    controls: ({ grid: g, init }) => [
      slider("tau", "temperature τ", g.tau_exp, init.tau, (e) => Number((10 ** e).toPrecision(3)).toString()),
      slider("row", "query row", [...Array(g.shape[0]).keys()], init.row)],
    update(cfg, s, h) {
      const g = cfg.grid, y = g.y[s.tau];
      const map = [];
      y.forEach((r, q) => r.forEach((v, k) => map.push({ query: q, key: k, y: v, selected: q === s.row })));
      const row = y[s.row].map((v, k) => ({ key: k, y: v, p: g.p[s.row][k] }));
      const k = g.sample[s.row];
      const tau = h.controls.tau.spec.options[s.tau];
      const text = `<p>τ = ${tau}, query ${s.row}: the largest weight is ${Math.max(...y[s.row]).toFixed(3)}; ` +
        `the Gumbel-max sample argmax(s + g) is key ${k} (▼). Black ticks: softmax(s), τ = 1 without noise.</p>`;
      return { charts: { map: { spec: "map", data: { map } },
                         row: { spec: "row", data: { row, sample: [{ key: k }] } } }, text };
    },
  };

  KINDS.topk = {
    charts: ["lines", "bars"],
    controls: ({ grid: g, init }) => [
      slider("k", "top-k k", g.k, init.k), slider("N", "length N", g.N, init.N, fmtInt),
      select("d", "head dim d", g.d, init.d)],
    update(cfg, s) {
      const g = cfg.grid, k = g.k[s.k];
      const runs = [["soft", "soft", "soft"], ["hard", "hard (argmax)", "hard (argmax)"],
                    ["topk:" + k, "top-k", `top-k (k = ${k})`]]
        .map(([key, series, group]) => ({ group, series, flat: (ni) => g.counts[key][s.d][ni] }));
      const { rows, lines, parts } = compare(runs, g.tensors, cfg.bpe, g.N, s.N);
      const text = `<p>One head, N = ${fmtInt(g.N[s.N])}, d = ${g.d[s.d]}, float16: ${parts.join(", ")}.</p>`;
      return { charts: linesAndBars(lines, g.N[s.N], rows), text };
    },
  };

  // ------------------------------------------------------------------ chapter 4
  KINDS.deformable = {
    charts: ["bars", "lines"],
    controls: ({ grid: g, init }) => [
      slider("r", "DAT factor r", g.r, init.r), slider("P", "MSDA points P", g.P, init.P),
      slider("L", "MSDA levels L", g.L, init.L), slider("side", "map side", g.side, init.side),
      select("d", "head dim d", g.d, init.d)],
    update(cfg, s) {
      const g = cfg.grid, c = g.counts;
      const pick = (alg, si) => (alg === "dense-image" ? c[alg][s.d][si]
        : alg === "msda" ? c[alg][s.d][si][s.L][s.P] : c[alg][s.d][si][s.r]);
      const runs = Object.entries(g.names).map(([name, alg]) => ({ group: name, series: name, flat: (si) => pick(alg, si) }));
      const { rows, lines, parts } = compare(runs, g.tensors, cfg.bpe, g.side, s.side);
      const side = g.side[s.side];
      const text = `<p>${side} × ${side} map (${fmtInt(side * side)} queries), d = ${g.d[s.d]}, r = ${g.r[s.r]}, ` +
        `L · P = ${g.L[s.L]} × ${g.P[s.P]}, float16: ${parts.join(", ")}.</p>`;
      return { charts: linesAndBars(lines, side, rows), text };
    },
  };
  // ------------------------------------------------------------------ chapter 5
  KINDS.decode = {
    charts: ["time", "waste"],
    controls: ({ grid: g, init }) => [
      select("B", "batch B", g.B, init.B), select("N", "context N", g.N, init.N, fmtInt),
      select("H_q", "query heads H_q", [...new Set(g.combos.map((c) => c[0]))], init.H_q),
      select("H_kv", "KV heads H_kv", [...new Set(g.combos.map((c) => c[1]))].sort((a, b) => a - b), init.H_kv),
      select("d", "head dim d", g.d, init.d), select("dtype", "dtype", g.dtypes, init.dtype, dtypeName),
      select("S", "splits", g.S, init.S), select("page", "page size", g.page, init.page),
      select("gpu", "GPU", g.gpus, init.gpu)],
    update(cfg, s, h) {
      const g = cfg.grid;
      const hq = h.controls.H_q.spec.options[s.H_q], hkv = h.controls.H_kv.spec.options[s.H_kv];
      const ic = g.combos.findIndex((c) => String(c[0]) === String(hq) && String(c[1]) === String(hkv));
      if (ic < 0) {
        return { charts: {}, text: `<p>H_kv = ${hkv} does not divide H_q = ${hq}: choose fewer KV heads.</p>` };
      }
      const ib = g.bpe.indexOf(g.dtypes[s.dtype][1]);
      const kern = g.kernel_line;  // the series the kernel draws, named by the grid
      // bytes of one step: the kernel's table has splits and pages, the others do not
      const at = (line, iN) => (line === kern ? g.bytes[line][s.B][iN][ic][s.d][ib][s.S][s.page]
        : g.bytes[line][s.B][iN][ic][s.d][ib]);
      const bw = g.bw[s.gpu];  // the one unit conversion: bytes / peak bandwidth = an estimate
      const lines = [];
      g.lines.forEach((line) => g.N.forEach((n, iN) => lines.push({ x: n, series: line, us: (at(line, iN) / bw) * 1e6 })));
      const w = g.waste[s.B][s.N];
      const waste = [{ layout: "pre-allocated", percent: w[0][0], chosen: "other" }]
        .concat(g.page.map((p, ip) => ({ layout: `pages of ${p}`, percent: w[ip][1], chosen: ip === s.page ? "chosen" : "other" })));
      const us = (at(kern, s.N) / bw) * 1e6;
      const text = `<p>KV cache per token and layer: <b>${human(g.token[ic][s.d][ib])}</b>; cache of the batch: ` +
        `<b>${human(g.cache[s.B][s.N][ic][s.d][ib])}</b>. Programs per SM: <b>${g.pps[s.B][ic][s.S][s.gpu]}</b> ` +
        `(FA2 grid: ${g.pps_fa2[s.B][ic][s.gpu]}). Step time at peak bandwidth (ESTIMATE): <b>${us.toPrecision(3)} µs</b> ` +
        `on ${esc(g.gpu_names[s.gpu])}. Cache wasted: ${w[s.page][0].toFixed(1)}% pre-allocated, ` +
        `${w[s.page][1].toFixed(1)}% in pages of ${g.page[s.page]}.</p>`;
      return { charts: { time: { spec: "time", data: { lines, marker: [{ x: g.N[s.N] }] } },
                         waste: { spec: "waste", data: { waste } } }, text };
    },
  };

  // ------------------------------------------------------------------ chapter 6
  KINDS.ring = {
    charts: ["work", "times"],
    controls: ({ grid: g, init }) => [
      slider("N", "sequence length N", g.N, init.N, fmtInt), slider("P", "devices P", g.P, init.P),
      select("heads", "heads", g.heads, init.heads), select("d", "head dim d", g.d, init.d),
      select("dtype", "dtype", g.dtype, init.dtype), checkbox("causal", "causal", init.causal),
      select("layout", "layout", g.layout, init.layout), select("link", "link", g.link, init.link),
      select("gpu", "GPU", g.gpu, init.gpu)],
    update(cfg, s) {
      // Rows were computed in Python (attention.explorers.ring.ring_grid); only look-ups here.
      const g = cfg.grid, c = cfg.colors, causal = s.causal ? 1 : 0;
      const mi = (((s.N * g.P.length + s.P) * g.heads.length + s.heads) * g.d.length + s.d) * g.dtype.length + s.dtype;
      const ri = (((mi * 2 + causal) * g.layout.length + s.layout) * g.gpu.length + s.gpu) * g.link.length + s.link;
      const wi = ((s.N * g.P.length + s.P) * 2 + causal) * g.layout.length + s.layout;
      const row = Object.fromEntries(g.fields.map((f, k) => [f, g.rows[ri][k]]));
      const mem = Object.fromEntries(g.memory_fields.map((f, k) => [f, g.memory[mi][k]]));
      const shares = g.work[g.work_index[wi]];
      const work = [];
      shares.forEach((r, t) => r.forEach((share, dev) => work.push({ device: dev, step: t, share })));
      const times = [
        { what: "compute, busiest step", ms: row.compute_ms, color: c.compute },
        { what: "K/V transfer, one step", ms: row.transfer_ms, color: c.send },
        { what: "ring, overlapped", ms: row.total_ms, color: c.total },
        { what: "ring, no overlap", ms: row.serial_ms, color: c.serial },
        { what: "all-gather of K/V (exposed)", ms: row.allgather_ms, color: c.allgather },
        { what: "all-gather CP (gather + compute)", ms: row.allgather_total_ms, color: c.allgather }];
      if (row.ulysses_ms !== null) times.push({ what: "Ulysses (all-to-all + compute)", ms: row.ulysses_ms, color: c.ulysses });
      const N = g.N[s.N], P = g.P[s.P];
      const uly = row.ulysses_ms === null ? "not possible: P must divide the heads"
        : `${row.ulysses_ms} ms (${row.ulysses_a2a_ms} ms of all-to-all), ${human(mem.ulysses)} per device`;
      const link = esc(g.link_names[s.link]) + (g.hypothetical[s.gpu][s.link] ? " (hypothetical)" : "");
      const text = `<p>N = ${fmtInt(N)}, P = ${P} (${fmtInt(N / P)} tokens per device), heads ${esc(g.heads[s.heads])}, ` +
        `d = ${g.d[s.d]}, ${g.dtype[s.dtype]}, ${s.causal ? "causal" : "not causal"}, ${g.layout[s.layout]}; ` +
        `${g.gpu[s.gpu]}, ${link}. ESTIMATES at peak rates.</p><ul>` +
        `<li>busiest step: compute ${row.compute_ms} ms, K/V transfer ${row.transfer_ms} ms: ` +
        `${Math.round(row.hidden_pct)}% of the transfer hidden</li>` +
        `<li>ring total ${row.total_ms} ms overlapped, ${row.serial_ms} ms without overlap; ` +
        `idle ${Math.round(100 * g.idle[wi])}% of device-steps</li>` +
        `<li>memory per device (one layer's attention tensors): ${human(mem.ring)}</li>` +
        `<li>all-gather context parallelism: ${row.allgather_total_ms} ms (${row.allgather_ms} ms ` +
        `of all-gather, exposed: ${Math.round(row.allgather_pct)}% of the attention it feeds), ` +
        `all of K/V ${human(mem.allgather_kv)} per device</li>` +
        `<li>DeepSpeed-Ulysses: ${uly}</li></ul>`;
      return { charts: { work: { spec: "work", data: { work } },
                         times: { spec: "times", data: { times } } }, text };
    },
  };
  // ------------------------------------------------------------------ chapter 7
  KINDS.blockmask = {
    charts: ["tiles", "bytes"],
    controls: ({ grid: g, init }) => [
      select("preset", "model preset", Object.keys(g.presets), init.preset),
      select("kind", "mask", g.kinds, init.kind),
      select("window", "window", g.values.window, init.window, fmtInt),
      select("document", "document length", g.values.document, init.document, fmtInt),
      select("prefix", "prefix", g.values.prefix, init.prefix, fmtInt),
      select("N", "sequence length N", g.N, init.N, fmtInt),
      select("B", "block size", g.B, init.B)],
    update(cfg, s, h) {
      // Rows were computed in Python (attention.explorers.blockmask.mask_grid); look-ups
      // and drawing only.
      const g = cfg.grid, pre = g.presets[Object.keys(g.presets)[s.preset]];
      const ki = pre ? pre[0] : s.kind, kind = g.kinds[ki];
      const vi = pre ? pre[1] : (kind === "causal" ? 0 : s[kind]);
      const value = g.values[kind][vi], N = g.N[s.N], B = g.B[s.B];
      for (const k of ["kind", "window", "document", "prefix"]) {
        h.controls[k].input.disabled = !!pre || (k !== "kind" && k !== kind);
      }
      const key = `${kind},${value},${N},${B}`, r = g.ranges[key], w = g.work[key];
      const rows = r.length / 4, cols = Math.ceil(N / B);
      const tiles = [{ x: 0, x2: cols, y: 0, y2: rows, tile: "empty" }];
      for (let i = 0; i < rows; i++) {
        const [jlo, flo, fhi, jhi] = r.slice(4 * i, 4 * i + 4);
        const rect = (a, b, tile) => { if (b > a) tiles.push({ x: a, x2: b, y: i, y2: i + 1, tile }); };
        if (fhi < flo) rect(jlo, jhi + 1, "partial");
        else { rect(jlo, flo, "partial"); rect(flo, fhi + 1, "full"); rect(fhi + 1, jhi + 1, "partial"); }
      }
      const c = g.work[`causal,0,${N},${B}`];
      const lines = [];
      const mine = g.lines[`${kind},${value},${B}`], dense = g.lines[`causal,0,${B}`];
      g.line_N.forEach((n, k) => lines.push({ x: n, series: "dense causal", mib: dense[k] / 2 ** 20 },
        { x: n, series: "this mask", mib: mine[k] / 2 ** 20 }));
      const what = kind === "causal" ? "causal" : `${kind} ${fmtInt(value)}`;
      const text = `<p>${esc(what)}, N = ${fmtInt(N)}, tiles ${B} × ${B}: the kernel visits ` +
        `<b>${fmtInt(w[0])}</b> of ${fmtInt(w[3])} tiles (<b>${(100 * w[0] / w[3]).toFixed(1)}%</b>; ` +
        `${fmtInt(w[1])} full, ${fmtInt(w[2])} partial), sparsity ${(100 * (w[3] - w[0]) / w[3]).toFixed(1)}%. ` +
        `One head, d = ${g.d}, bf16: <b>${human(w[4])}</b> of HBM traffic and <b>${(w[5] / 1e9).toFixed(2)}</b> ` +
        `GFLOPs, against dense causal's ${human(c[4])} and ${(c[5] / 1e9).toFixed(2)} GFLOPs ` +
        `(${(w[5] / c[5]).toFixed(2)}× the FLOPs).</p>`;
      return { charts: { tiles: { spec: "tiles", data: { tiles } },
                         bytes: { spec: "bytes", data: { lines, marker: [{ x: N }] } } }, text };
    },
  };
  // ================================================================== the chapters' pictures
  // (attention/explorers/maps.py, softmax.py, estimators.py, sampling.py): rows computed
  // in Python, looked up here.
  const range = (n) => [...Array(n).keys()];
  /** Give a slider the options 0..n-1 when their count changed (a new task, block). */
  function fitOptions(ctl, n, f) {
    if (ctl.spec.options.length !== n) ctl.setOptions(range(n).map(f || String));
    return Math.min(ctl.get(), n - 1);
  }

  // ------------------------------------------------------------------ chapter 1: maps
  KINDS.maps = {
    charts: ["map", "row"],
    controls: ({ grid: g, init }) => {
      const t = g.tasks[init.task];
      return [select("task", "task", g.tasks.map((x) => x.name), init.task),
        slider("example", "example", range(t.E), init.example),
        slider("head", "head", range(t.H), init.head),
        slider("row", "query row", range(t.m), init.row)];
    },
    update(cfg, s, h) {
      const t = cfg.grid.tasks[s.task];
      const e = fitOptions(h.controls.example, t.E), hd = fitOptions(h.controls.head, t.H);
      const r = fitOptions(h.controls.row, t.m);
      const qs = t.queries ? t.queries[e] : range(t.m).map(String);
      const ks = t.keys ? t.keys[e] : range(t.n).map(String);
      const qname = (i) => `${i}: ${qs[i]}`, kname = (j) => `${j}: ${ks[j]}`;
      const w = t.w[e][hd];
      const cells = [], row = [];
      w.forEach((wr, i) => wr.forEach((v, j) => cells.push({ i, j, query: qname(i), key: kname(j), w: v })));
      w[r].forEach((v, j) => row.push({ j, key: kname(j), w: v }));
      const outline = range(t.n).map((j) => ({ i: r, j, query: qname(r), key: kname(j) }));
      let best = 0;
      w[r].forEach((v, j) => { if (v > w[r][best]) best = j; });
      let text = `<p>${esc(t.name)}, example ${e}, head ${hd}: query ${r} (<b>${esc(qs[r])}</b>) puts ` +
        `<b>${w[r][best].toFixed(2)}</b> of its weight on key ${best} (<b>${esc(ks[best])}</b>)`;
      if (t.outputs) text += `; the model outputs <b>${esc(t.outputs[e][r])}</b>`;
      if (t.targets) text += ` (target ${esc(t.targets[e][r])})`;
      return { charts: { map: { spec: "map", data: { cells, outline } },
                         row: { spec: "row", data: { row } } }, text: text + ".</p>" };
    },
  };

  // ------------------------------------------------------------------ chapter 1: MiniLM
  // (attention/explorers/pretrained.py: weights in thousandths, statistics and the
  // measured head types computed in Python at build time)
  KINDS.pretrained = {
    charts: ["map", "heads"],
    controls: ({ grid: g, init }) => {
      const s = g.sentences[init.sentence];
      return [select("sentence", "sentence", g.sentences.map((x) => x.name), init.sentence),
        slider("layer", "layer", range(g.L), init.layer, (i) => String(i + 1)),
        slider("head", "head", range(g.H), init.head, (i) => String(i + 1)),
        slider("row", "query row", range(s.tokens.length), init.row, (i) => `${i}: ${s.tokens[i]}`)];
    },
    update(cfg, st, h) {
      const g = cfg.grid, s = g.sentences[st.sentence], t = s.tokens, n = t.length;
      const rows = range(n).map((i) => `${i}: ${t[i]}`), ctl = h.controls.row;
      if (ctl.spec.options.join("\n") !== rows.join("\n")) ctl.setOptions(rows);
      const r = Math.min(ctl.get(), n - 1);
      const l = st.layer, hd = st.head, w = s.w[l][hd];
      const qname = (i) => `${i}: ${t[i]}`;
      const cells = [];
      w.forEach((wr, i) => wr.forEach((v, j) => cells.push({ i, j, query: qname(i), key: qname(j), w: v / 1000 })));
      const outline = range(n).map((j) => ({ i: r, j, query: qname(r), key: qname(j) }));
      const heads = [];
      for (let a = 0; a < g.L; a++) for (let b = 0; b < g.H; b++)
        heads.push({ layer: a + 1, head: b + 1, entropy: s.entropy[a][b], type: g.types[a][b], letter: g.letters[g.types[a][b]] });
      let best = 0;
      w[r].forEach((v, j) => { if (v > w[r][best]) best = j; });
      const f2 = (x) => Number(x).toFixed(2);
      const text = `<p>Head ${l + 1}-${hd + 1}: measured type <b>${esc(g.types[l][hd])}</b> (over ${g.n_measured} sentences). ` +
        `On this sentence its mean row entropy is ${f2(s.entropy[l][hd])} bits (uniform: ${f2(s.uniform)}); ` +
        `a row puts ${f2(s.cls[l][hd])} of its weight on [CLS], ${f2(s.sep[l][hd])} on [SEP] and ${f2(s.punct[l][hd])} on punctuation. ` +
        `Query ${r} (<b>${esc(t[r])}</b>) puts <b>${(w[r][best] / 1000).toFixed(3)}</b> on key ${best} (<b>${esc(t[best])}</b>).</p>`;
      return { charts: { map: { spec: "map", data: { cells, outline } },
                         heads: { spec: "heads", data: { heads, chosen: [{ layer: l + 1, head: hd + 1 }] } } }, text };
    },
  };

  // ------------------------------------------------------------------ chapter 1: SmolLM2
  // (attention/explorers/causal_lm.py: each head's causal map as its lower triangle row by
  // row in hundredths, every score computed in Python at build time)
  KINDS.causal_lm = {
    charts: ["map", "grid"],
    controls: ({ grid: g, init }) => [
      select("prompt", "prompt", g.prompts.map((x) => x.name), init.prompt),
      slider("layer", "layer", range(g.L), init.layer, (i) => String(i + 1)),
      slider("head", "head", range(g.H), init.head, (i) => String(i + 1)),
      select("score", "grid shows", g.scores, init.score)],
    update(cfg, st) {
      const g = cfg.grid, p = g.prompts[st.prompt], t = p.tokens, n = t.length;
      const l = st.layer, hd = st.head, w = p.w[l][hd];
      const name = (i) => `${i}: ${t[i]}`;
      const cells = [];
      for (let i = 0; i < n; i++) for (let j = 0; j <= i; j++)
        cells.push({ i, j, query: name(i), key: name(j), w: w[(i * (i + 1)) / 2 + j] / 100 });
      const key = g.keys[st.score], heads = [];
      for (let a = 0; a < g.L; a++) for (let b = 0; b < g.H; b++)
        heads.push({ layer: a + 1, head: b + 1, value: g.probe[key][a][b] });
      const f2 = (x) => Number(x).toFixed(2);
      let on = `previous token ${f2(p.previous[l][hd])}, first token ${f2(p.sink[l][hd])}`;
      if (p.induction) on += `, induction ${f2(p.induction[l][hd])}`;
      const pr = g.probe;
      const text = `<p>Head ${l + 1}-${hd + 1} on this prompt: ${on}. Over the ${g.n_seq} random ` +
        `sequences of ${g.length} ids repeated twice: induction <b>${f2(pr.induction[l][hd])}</b>, ` +
        `previous token <b>${f2(pr.previous[l][hd])}</b>, first token <b>${f2(pr.sink[l][hd])}</b>.</p>`;
      return { charts: { map: { spec: "map", data: { cells } },
                         grid: { spec: "grid", data: { heads, chosen: [{ layer: l + 1, head: hd + 1 }] } } }, text };
    },
  };

  KINDS.masks = {
    charts: ["mask"],
    controls: ({ grid: g, init }) => [select("kind", "mask", g.kinds, init.kind),
      slider("n_q", "queries N_q", g.sizes, init.n_q), slider("n_k", "keys N_k", g.sizes, init.n_k),
      slider("length", "real keys (padding)", g.sizes, init.length)],
    update(cfg, s, h) {
      const g = cfg.grid, kind = g.kinds[s.kind], nq = g.sizes[s.n_q], nk = g.sizes[s.n_k];
      const pad = kind.includes("padding");
      h.controls.length.input.disabled = !pad;
      const len = pad ? Math.min(g.sizes[s.length], nk) : 0;
      const [keep, p] = g.masks[`${s.kind},${nq},${nk},${len}`];
      const cells = [];
      let kept = 0, empty = 0;
      keep.forEach((bits, i) => {
        if (!bits.includes("1")) empty += 1;
        [...bits].forEach((b, j) => {
          kept += b === "1";
          cells.push({ i, j, cell: b === "1" ? "may attend" : "masked", p: p[i][j] / 1000,
                       label: b === "1" ? (p[i][j] / 1000).toFixed(2) : "" });
        });
      });
      let text = `<p>${esc(kind)}, N_q = ${nq}, N_k = ${nk}` + (pad ? `, ${len} real keys` : "") +
        `: ${kept} of ${nq * nk} cells may attend`;
      if (kind.includes("causal")) text += `; query i sees keys j ≤ i ${nk >= nq ? "+" : "−"} ${Math.abs(nk - nq)} (bottom-right)`;
      if (empty) text += `; <b>${empty}</b> rows see no key: weights 0, output 0`;
      return { charts: { mask: { spec: "mask", data: { cells } } },
               text: text + ". Numbers: softmax of fixed random scores under the mask.</p>" };
    },
  };
  // ------------------------------------------------------------------ chapter 2: online softmax
  KINDS.online = {
    charts: ["scores", "weights", "state"],
    controls: ({ grid: g, init }) => [select("block", "block size", g.blocks, init.block),
      slider("step", "block step", range(g.runs[init.block].length), init.step,
        (i) => `${i + 1} of ${g.runs[init.block].length}`)],
    update(cfg, s, h) {
      const g = cfg.grid, run = g.runs[s.block];
      const k = fitOptions(h.controls.step, run.length, (i) => `${i + 1} of ${run.length}`);
      const st = run[k];
      const status = (j) => (j < st.a ? "seen" : j < st.b ? "this block" : "not yet");
      const keys = g.s.map((sj, j) => ({ j, s: sj, status: status(j), w: st.w[j], p: g.p[j] }));
      const max = [{ what: "running max m", y: st.m }, { what: "final max", y: run[run.length - 1].m }];
      const state = [];
      run.forEach((r, i) => state.push({ step: i + 1, what: "m", value: r.m },
        { step: i + 1, what: "ℓ", value: r.l }, { step: i + 1, what: "α", value: r.alpha }));
      const f = (xs) => "[" + xs.map((x) => x.toFixed(3)).join(", ") + "]";
      const text = `<p>Block ${k + 1} of ${run.length} (keys ${st.a} to ${st.b - 1}): running max ` +
        `<b>m = ${st.m.toFixed(3)}</b>, rescale factor <b>α = exp(m_old − m) = ${st.alpha.toFixed(3)}</b>, ` +
        `sum <b>ℓ = ${st.l.toFixed(3)}</b>; accumulator acc = ${f(st.acc)}, acc / ℓ = ${f(st.acc.map((x) => x / st.l))}; ` +
        `exact output softmax(s) V = ${f(g.o)}. Black ticks: the exact softmax.</p>`;
      return { charts: { scores: { spec: "scores", data: { keys, max } },
                         weights: { spec: "weights", data: { keys } },
                         state: { spec: "state", data: { state, now: [{ step: k + 1 }] } } }, text };
    },
  };

  // ------------------------------------------------------------------ chapter 2: roofline
  KINDS.roofline = {
    charts: ["roof"],
    controls: ({ grid: g, init }) => [select("gpu", "GPU", g.gpu_names, init.gpu),
      slider("N", "sequence length N", g.N, init.N, fmtInt), select("d", "head dim d", g.d, init.d),
      select("dtype", "dtype", g.dtypes, init.dtype), select("alg", "algorithm", g.algs, init.alg)],
    update(cfg, s) {
      const g = cfg.grid, r = g.rows[s.gpu][s.N][s.d][s.dtype][s.alg];
      const roof = g.roofs[s.gpu][s.dtype].map(([ai, tflops]) => ({ ai, tflops }));
      const points = [{ traffic: "simulated (no L2)", ai: r[0], tflops: r[1], us: r[2] },
                      { traffic: "compulsory", ai: r[3], tflops: r[4], us: r[5] }];
      const text = `<p><b>${esc(g.algs[s.alg])}</b>, one head, N = ${fmtInt(g.N[s.N])}, d = ${g.d[s.d]}, ` +
        `${g.dtypes[s.dtype]} on ${esc(g.gpu_names[s.gpu])} (roof ${roof[1].tflops} TFLOP/s, ridge at ` +
        `${roof[1].ai.toPrecision(3)} FLOPs/byte). Simulated traffic (${g.tile} × ${g.tile} tiles, no L2): ` +
        `<b>${r[0].toPrecision(3)}</b> FLOPs/byte, ${r[1].toPrecision(3)} TFLOP/s, ${r[2].toPrecision(3)} µs; ` +
        `compulsory: <b>${r[3].toPrecision(3)}</b> FLOPs/byte, ${r[4].toPrecision(3)} TFLOP/s, ` +
        `${r[5].toPrecision(3)} µs. ESTIMATES at peak rates.</p>`;
      return { charts: { roof: { spec: "roof", data: { roof, points } } }, text };
    },
  };
  // ------------------------------------------------------------------ chapter 3: estimators
  KINDS.estimators = {
    charts: ["hist", "bars"],
    controls: ({ grid: g, init }) => [select("method", "estimator", g.methods, init.method),
      slider("tau", "temperature τ (Gumbel)", g.taus, init.tau),
      slider("samples", "samples per estimate", g.samples, init.samples),
      slider("j", "logit j", range(g.logits.length), init.j)],
    update(cfg, s, h) {
      const g = cfg.grid, gumbel = (mi) => g.methods[mi].includes("Gumbel");
      h.controls.tau.input.disabled = !gumbel(s.method);
      const at = (mi) => g.runs[`${mi},${gumbel(mi) ? s.tau : 0},${s.samples}`][s.j];
      const r = at(s.method), H = r.hist, n = H.counts.length, w = (H.hi - H.lo) / n;
      const hist = H.counts.map((count, i) => ({ x0: H.lo + i * w, x1: H.lo + (i + 1) * w, count }));
      const lines = [{ what: "mean of the estimates", x: r.mean }, { what: "true gradient", x: g.true[s.j] }];
      const bars = [];
      g.methods.forEach((method, mi) => {
        const q = at(mi);
        bars.push({ method, stat: "|bias|", value: Math.abs(q.bias) }, { method, stat: "std", value: q.std });
      });
      const tau = gumbel(s.method) ? ` at τ = ${g.taus[s.tau]}` : "";
      const text = `<p>z ~ softmax(s) over ${g.logits.length} positions, loss f(z); s = [${g.logits.join(", ")}], ` +
        `f = [${g.losses.join(", ")}]. <b>${esc(g.methods[s.method])}</b>${tau}, ${g.samples[s.samples]} samples per ` +
        `estimate, ${fmtInt(g.draws)} estimates of ∂E[f]/∂s_${s.j}: mean <b>${r.mean.toFixed(4)}</b> against the true ` +
        `<b>${g.true[s.j].toFixed(4)}</b>, bias ${r.bias >= 0 ? "+" : ""}${r.bias.toFixed(4)} (standard error ` +
        `${r.se.toFixed(4)}), std <b>${r.std.toFixed(4)}</b>.</p>`;
      return { charts: { hist: { spec: "hist", data: { hist, lines } },
                         bars: { spec: "bars", data: { bars } } }, text };
    },
  };
  // ------------------------------------------------------------------ chapter 4: sampling points
  KINDS.sampling = {
    charts: ["dat", "msda"],
    controls: ({ grid: g, init }) => {
      const side = Math.round(Math.sqrt(g.queries.length));
      const rows = range(side).map((k) => g.queries[k * side][0]);
      const cols = range(side).map((k) => g.queries[k][1]);
      const out = [slider("qrow", "query row", rows, Math.floor(init.query / side)),
        slider("qcol", "query column", cols, init.query % side),
        slider("scale", "offset scale", g.scales, init.scale, (x) => "× " + x),
        select("label", "offsets", g.labels, init.label),
        slider("head", "head", range(g.n_heads), init.head)];
      if (g.msda) out.push(select("level", "MSDA level", ["all"].concat(g.level_shapes.map((s, i) => `level ${i} (${s[0]} × ${s[1]})`)), init.level));
      return out;
    },
    update(cfg, s) {
      const g = cfg.grid, side = Math.round(Math.sqrt(g.queries.length));
      const q = s.qrow * side + s.qcol, [r, c] = g.queries[q];
      const run = g.dat[g.labels[s.label]][s.scale], grp = Math.floor((s.head * g.n_groups) / g.n_heads);
      const pts = run.points[grp], wts = run.weights[s.head][q];
      const img = (url) => [{ url, x0: 0, x1: g.W, y0: 0, y1: g.H }];
      const query = [{ x: c + 0.5, y: r + 0.5 }];
      const links = [], points = [];
      let best = 0;
      pts.forEach(([x, y], k) => {
        const [x0, y0] = g.reference[k];
        links.push({ x: x0, y: y0, x2: x, y2: y });
        points.push({ x: x0, y: y0, kind: "reference points", w: 0, shape: "circle" });
        if (wts[k] > wts[best]) best = k;
      });
      pts.forEach(([x, y], k) => points.push({ x, y, kind: "deformed points (size: weight)", w: wts[k] / 1e4, shape: "circle" }));
      const charts = { dat: { spec: "dat", data: { image: img(g.photo), links, points, query } } };
      let text = `<p>Query at row ${r}, column ${c} (+); DAT, ${esc(g.labels[s.label])} offsets × ${g.scales[s.scale]}, ` +
        `head ${s.head} (group ${grp}): ${pts.length} sampled keys, the largest weight <b>${(wts[best] / 1e4).toFixed(3)}</b> on ` +
        `the key sampled at (${pts[best][0].toFixed(1)}, ${pts[best][1].toFixed(1)}) (uniform: ${(1 / pts.length).toFixed(3)}).`;
      if (g.msda) {
        const m = g.msda[s.scale], loc = m.locations[q], mw = m.weights[q];
        const lv = s.level - 1, mp = [], shares = g.level_shapes.map(() => 0);
        const shapes = ["circle", "square", "triangle-up", "diamond"];
        const names = g.level_shapes.map((sh, i) => `level ${i} (${sh[0]} × ${sh[1]})`);
        loc.forEach((hl, h) => hl.forEach((lp, l) => lp.forEach(([x, y], k) => {
          shares[l] += mw[h][l][k] / 1e4 / loc.length;
          if (lv < 0 || lv === l) mp.push({ x, y, kind: names[l], w: mw[h][l][k] / 1e4, shape: shapes[h % 4] });
        })));
        charts.msda = { spec: "msda", data: { image: img(lv < 0 ? g.photo : g.levels[lv]), links: [], points: mp, query } };
        text += ` MSDA (the second picture; circles head 0, squares head 1): the query's own ${mp.length} points` +
          (lv < 0 ? " on every level" : ` on ${names[lv]}`) + `; weight per level, averaged over heads: ` +
          shares.map((x, i) => `${i}: ${x.toFixed(2)}`).join(", ") + ".";
      }
      return { charts, text: text + "</p>" };
    },
  };
  // ------------------------------------------------------------------ chapter 8
  // (attention/explorers/sparse.py: every selection, mass and cost computed in Python
  // at build time; looked up and drawn here)
  KINDS.sparse = {
    charts: ["map", "row"],
    controls: ({ grid: g, init }) => [
      select("method", "selection", g.names, init.method),
      slider("N", "sequence length N", g.N, init.N, fmtInt),
      select("B", "block size", g.B, init.B),
      slider("topk", "budget (blocks)", g.topks, init.topk),
      slider("query", "query row", g.queries[String(g.N[init.N])], init.query, fmtInt)],
    update(cfg, s, h) {
      const g = cfg.grid, m = g.methods[s.method], N = g.N[s.N], B = g.B[s.B], k = g.topks[s.topk];
      const qs = g.queries[String(N)], ctl = h.controls.query, shown = qs.map(fmtInt);
      if (ctl.spec.options.join("|") !== shown.join("|")) ctl.setOptions(shown);
      const query = qs[Math.min(ctl.get(), qs.length - 1)], T = g.topk;
      const row = g.rows[`${m},${N},${B},${query}`], orc = g.rows[`oracle,${N},${B},${query}`];
      const chosen = row.slice(0, k).filter((b) => b >= 0);
      const mass = g.mass[`${N},${B},${query}`], n = g.thumb_size, w = N / n;
      const end = (b) => Math.min((b + 1) * B, query + 1);
      const cells = [];
      g.thumb[String(N)].forEach((r, a) => r.forEach((v, b) => {
        if (v > 0) cells.push({ x: b * w, x2: (b + 1) * w, y: a * w, y2: (a + 1) * w, mass: v / 1000 });
      }));
      const picked = chosen.map((b) => ({ x: b * B, x2: end(b), y: query - w, y2: query + w, color: g.colors[s.method] }));
      const blocks = mass.map((v, b) => ({ x: b * B, x2: end(b), mass: v / 1000,
                                           chosen: chosen.includes(b) ? "chosen" : "not chosen" }));
      const keys = sum(chosen.map((b) => end(b) - b * B));
      const [fl, by, gfl, gby, dfl, dby] = g.cost[`${N},${B}`][s.topk];
      const gf = (x) => String(Number((x / 1e9).toPrecision(3)));
      const text = `<p>${esc(g.names[s.method])}, N = ${fmtInt(N)}, blocks of ${B}, budget ${k}: query ` +
        `${fmtInt(query)} reads <b>${chosen.length}</b> of its ${mass.length} visible blocks ` +
        `(${fmtInt(keys)} of ${fmtInt(query + 1)} keys) and keeps <b>${row[T + s.topk].toFixed(1)}%</b> of ` +
        `its attention mass (the oracle's ${k} blocks: ${orc[T + s.topk].toFixed(1)}%). A causal prefill of N tokens, ` +
        `one head, d = ${g.d}, bf16: <b>${gf(fl)}</b> GFLOPs and <b>${human(by)}</b> of HBM traffic, plus the gate's ` +
        `${gf(gfl)} GFLOPs and ${human(gby)}; dense causal attention: ${gf(dfl)} GFLOPs and ${human(dby)}. So ` +
        `<b>${((fl + gfl) / dfl).toFixed(2)}×</b> the FLOPs and <b>${(by / dby).toFixed(2)}×</b> the bytes of dense: ` +
        `each query loads its own blocks, where the dense kernel shares each K/V tile among ${g.dense_tile} queries.</p>`;
      return { charts: { map: { spec: "map", data: { cells, query: [{ y: query }], chosen: picked } },
                         row: { spec: "row", data: { blocks } } }, text };
    },
  };
})();
