/* The book's static explorers (attention/explorers/static.py writes their data into
 * the page).
 *
 * Each <div class="static-explorer"> holds JSON: the controls' grids, Vega-Lite specs and
 * the numbers attention.memory (or attention.hard) computed when the chapter executed.
 * This script builds native controls, looks the chosen rows up and hands them to Vega
 * (vega-bundle.js, vendored from vl-convert-python). It computes nothing about attention:
 * the one product is bytes = elements x bytes per element, exactly Traffic.bytes.
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
      select("H_kv", "KV heads H_kv", [1, 2, 4, 8, 16, 32, 64], init.H_kv),
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
      const kern = g.lines[2];
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
      const [ringMem, ulyMem] = g.memory[mi];
      const shares = g.work[g.work_index[wi]];
      const work = [];
      shares.forEach((r, t) => r.forEach((share, dev) => work.push({ device: dev, step: t, share })));
      const times = [
        { what: "compute, busiest step", ms: row.compute_ms, color: c.compute },
        { what: "K/V transfer, one step", ms: row.transfer_ms, color: c.send },
        { what: "ring, overlapped", ms: row.total_ms, color: c.total },
        { what: "ring, no overlap", ms: row.serial_ms, color: "#8C8C8C" }];
      if (row.ulysses_ms !== null) times.push({ what: "Ulysses (all-to-all + compute)", ms: row.ulysses_ms, color: c.ulysses });
      const N = g.N[s.N], P = g.P[s.P];
      const uly = row.ulysses_ms === null ? "not possible: P must divide the heads"
        : `${row.ulysses_ms} ms (${row.ulysses_a2a_ms} ms of all-to-all), ${human(ulyMem)} per device`;
      const text = `<p>N = ${fmtInt(N)}, P = ${P} (${fmtInt(N / P)} tokens per device), heads ${esc(g.heads[s.heads])}, ` +
        `d = ${g.d[s.d]}, ${g.dtype[s.dtype]}, ${s.causal ? "causal" : "not causal"}, ${g.layout[s.layout]}; ` +
        `${g.gpu[s.gpu]}, ${esc(g.link_names[s.link])}. ESTIMATES at peak rates.</p><ul>` +
        `<li>busiest step: compute ${row.compute_ms} ms, K/V transfer ${row.transfer_ms} ms: ` +
        `${Math.round(row.hidden_pct)}% of the transfer hidden</li>` +
        `<li>ring total ${row.total_ms} ms overlapped, ${row.serial_ms} ms without overlap; ` +
        `idle ${Math.round(100 * g.idle[wi])}% of device-steps</li>` +
        `<li>memory per device (one layer's attention tensors): ${human(ringMem)}</li>` +
        `<li>DeepSpeed-Ulysses: ${uly}</li></ul>`;
      return { charts: { work: { spec: "work", data: { work } },
                         times: { spec: "times", data: { times } } }, text };
    },
  };
})();
