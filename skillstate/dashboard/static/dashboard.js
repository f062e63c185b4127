/* skillstate dashboard: charts, live updates and the provenance panel.
 *
 * Every piece of text that comes from a run (skills, edits, failures, model
 * output) is set with textContent or drawn by Chart.js on a canvas: nothing
 * from the log is ever parsed as HTML here. Live updates fetch the page again
 * from the server (which escapes everything), parse it with DOMParser and swap
 * the regions marked data-live. */
"use strict";

(function () {
  const POLL_MS = 1500;
  const C = {
    brand: "#3b5bdb", best: "#1c2330", current: "#4c6ef5", accept: "#2f9e44", acceptBest: "#e8a400",
    reject: "#d6336c", skip: "#868e96", baseline: "#868e96", test: "#7048e8", slow: "#ae3ec9",
    inherited: "#adb5bd", grid: "#eef0f4", runs: ["#3b5bdb", "#e8590c", "#2f9e44", "#ae3ec9"],
  };
  const charts = {};

  function readJSON(id) {
    const node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function num(v, d) { return v === null || v === undefined ? "–" : Number(v).toFixed(d === undefined ? 3 : d); }

  function lastStep(c) { return c.steps.length ? c.steps[c.steps.length - 1].step : 0; }

  function pointsOf(c, pick) {
    return c.steps.filter(pick).map((s) => ({
      x: s.step,
      y: s.early_reject_bound !== null ? s.early_reject_bound : (s.candidate_score !== null ? s.candidate_score : s.current_score),
      step: s.step, reason: s.reason, decision: s.decision,
    })).filter((p) => p.y !== null && p.y !== undefined);
  }

  function scoreLine(c, key, label, color, width, dash) {
    const start = c.baseline ? [{ x: 0, y: c.baseline.gate }] : [];
    const data = start.concat(c.steps.filter((s) => s[key] !== null).map((s) => ({ x: s.step, y: s[key] })));
    const inheritedUpTo = c.fork_step || 0;
    return {
      type: "line", label, data, borderColor: color, backgroundColor: color, borderWidth: width, stepped: "before",
      pointRadius: 0, pointHitRadius: 6, borderDash: dash || [], order: 5,
      segment: { borderColor: (ctx) => (ctx.p1.parsed.x <= inheritedUpTo ? C.inherited : color) },
    };
  }

  function marker(label, data, style, color, radius, hollow) {
    return {
      type: "scatter", label, data, pointStyle: style, pointRadius: radius, pointHoverRadius: radius + 2,
      borderColor: color, backgroundColor: hollow ? "rgba(255,255,255,0)" : color, borderWidth: hollow ? 2 : 1,
      order: 1,
    };
  }

  function curveDatasets(c) {
    const own = (s) => !s.inherited;
    const sets = [
      scoreLine(c, "best_score", "best", C.best, 3),
      scoreLine(c, "current_score", "current", C.current, 1.5),
      marker("accepted", pointsOf(c, (s) => own(s) && s.decision === "accept"), "triangle", C.accept, 6),
      marker("new best", pointsOf(c, (s) => own(s) && s.decision === "accept_best"), "star", C.acceptBest, 9),
      marker("rejected", pointsOf(c, (s) => own(s) && s.decision === "reject" && s.early_reject_bound === null),
        "crossRot", C.reject, 6),
      marker("rejected early (bound)", pointsOf(c, (s) => own(s) && s.decision === "reject" && s.early_reject_bound !== null),
        "circle", C.reject, 4, true),
      marker("skipped", pointsOf(c, (s) => own(s) && s.decision === "skip"), "rectRot", C.skip, 5),
    ];
    const inherited = pointsOf(c, (s) => s.inherited && s.decision);
    if (inherited.length) sets.push(marker("parent's steps", inherited, "circle", C.inherited, 3));
    const end = Math.max(lastStep(c), c.total_steps || 0);
    if (c.baseline) {
      sets.push({ type: "line", label: "baseline", data: [{ x: 0, y: c.baseline.gate }, { x: end, y: c.baseline.gate }],
        borderColor: C.baseline, borderDash: [6, 5], borderWidth: 1.5, pointRadius: 0, order: 6 });
    }
    if (c.slow_updates && c.slow_updates.length) {
      sets.push(marker("slow update", c.slow_updates.filter((u) => u.candidate_score !== null)
        .map((u) => ({ x: u.after_step, y: u.candidate_score, reason: u.reason, decision: u.decision })), "rect", C.slow, 6));
    }
    const tests = [];
    const at = end + (end <= 30 ? 0.25 : end / 100); // just past the last step
    if (c.tests.baseline) tests.push({ x: at, y: c.tests.baseline.hard, reason: "test, initial skill", decision: "" });
    if (c.tests.best) tests.push({ x: at, y: c.tests.best.hard, reason: "test, best skill", decision: "" });
    if (tests.length) sets.push(marker("test (end)", tests, "rectRounded", C.test, 7));
    return sets;
  }

  function scoreAxes(c, xTitle) {
    const end = Math.max(lastStep(c), c.total_steps || 0, 1);
    return {
      x: { type: "linear", min: 0, max: end + (end <= 30 ? 0.4 : end / 60), title: { display: true, text: xTitle || "step" },
        ticks: { precision: 0, stepSize: end <= 30 ? 1 : undefined, includeBounds: false }, grid: { color: C.grid } },
      y: { suggestedMin: 0, suggestedMax: 1, title: { display: true, text: "score" }, grid: { color: C.grid } },
    };
  }

  function tooltip() {
    return {
      callbacks: {
        title: (items) => (items.length && Number.isInteger(items[0].parsed.x) ? "step " + items[0].parsed.x : ""),
        label: (ctx) => {
          const raw = ctx.raw || {};
          const head = ctx.dataset.label + ": " + num(ctx.parsed.y);
          return raw.reason ? [head, String(raw.reason).slice(0, 120)] : head;
        },
      },
    };
  }

  const builders = {
    curves(c) {
      return { data: { datasets: curveDatasets(c) }, options: base({ scales: scoreAxes(c), plugins: { tooltip: tooltip() } }) };
    },
    budget(c) {
      const colour = (d) => ({ accept: C.accept, accept_best: C.acceptBest, reject: C.reject, skip: C.skip }[d] || "#ced4da");
      return {
        type: "bar",
        data: { labels: c.steps.map((s) => s.step), datasets: [{ label: "edit budget", data: c.steps.map((s) => s.edit_budget),
          backgroundColor: c.steps.map((s) => colour(s.decision)) }] },
        options: base({ plugins: { legend: { display: false } },
          scales: { x: { title: { display: true, text: "step (bar colour: the decision)" }, grid: { display: false } },
            y: { beginAtZero: true, ticks: { precision: 0 }, title: { display: true, text: "edits" }, grid: { color: C.grid } } } }),
      };
    },
    stages(cost) {
      const entries = Object.entries(cost || {}).sort((a, b) => b[1] - a[1]);
      return {
        type: "bar",
        data: { labels: entries.map((e) => e[0]), datasets: [{ label: "USD", data: entries.map((e) => e[1]), backgroundColor: C.brand }] },
        options: base({ indexAxis: "y", plugins: { legend: { display: false },
          tooltip: { callbacks: { label: (ctx) => "$" + Number(ctx.parsed.x).toFixed(4) } } },
        scales: { x: { beginAtZero: true, title: { display: true, text: "USD" }, grid: { color: C.grid } }, y: { grid: { display: false } } } }),
      };
    },
    compare(runs) {
      const sets = [];
      runs.forEach((c, i) => {
        const colour = C.runs[i % C.runs.length];
        const name = (i === 0 ? "A " : "B ") + c.run_id.slice(0, 28);
        const best = scoreLine(c, "best_score", name + " best", colour, 3);
        const cur = scoreLine(c, "current_score", name + " current", colour, 1, [4, 3]);
        const cand = marker(name + " candidates", pointsOf(c, (s) => s.decision), "circle", colour, 3);
        if (c.baseline) sets.push({ type: "line", label: name + " baseline", borderColor: colour, borderDash: [2, 4],
          borderWidth: 1, pointRadius: 0, data: [{ x: 0, y: c.baseline.gate }, { x: Math.max(lastStep(c), 1), y: c.baseline.gate }] });
        sets.push(best, cur, cand);
      });
      const widest = runs.reduce((a, c) => (lastStep(c) > lastStep(a) ? c : a), runs[0]);
      const legend = { position: "bottom", labels: { usePointStyle: true, boxWidth: 8, filter: (item) => / best$/.test(item.text) } };
      return { data: { datasets: sets }, options: base({ scales: scoreAxes(widest), plugins: { tooltip: tooltip(), legend } }) };
    },
    growth(rows) {
      const cats = Array.from(new Set(rows.flatMap((r) => Object.keys(r.by_category)))).sort();
      const palette = ["#3b5bdb", "#e8590c", "#2f9e44", "#ae3ec9", "#1098ad", "#f08c00", "#d6336c", "#5c940d"];
      const sets = cats.map((cat, i) => ({ type: "line", label: cat, data: rows.map((r) => ({ x: r.step, y: r.by_category[cat] || 0 })),
        borderColor: palette[i % palette.length], backgroundColor: palette[i % palette.length], pointRadius: 2, stepped: "before" }));
      sets.push({ type: "line", label: "total", data: rows.map((r) => ({ x: r.step, y: r.total })), borderColor: C.best,
        borderWidth: 3, pointRadius: 0, stepped: "before" });
      return { data: { datasets: sets }, options: base({ scales: { x: { type: "linear", min: 0, title: { display: true, text: "step" },
        ticks: { precision: 0 } }, y: { beginAtZero: true, ticks: { precision: 0 }, title: { display: true, text: "skills" } } } }) };
    },
  };

  /* a policy training run: one metric TRL logged, by step; the val score at each validation, per category */
  const policyBuilders = {
    metric(d, canvas) {
      const name = canvas.dataset.metric;
      const points = (d.curves[name] || []).map((p) => ({ x: p[0], y: p[1] }));
      return { data: { datasets: [{ type: "line", label: name, data: points, borderColor: C.brand, backgroundColor: C.brand,
        borderWidth: 1.5, pointRadius: points.length > 40 ? 0 : 2 }] },
      options: base({ plugins: { legend: { display: false } }, scales: {
        x: { type: "linear", title: { display: true, text: "step" }, ticks: { precision: 0 }, grid: { color: C.grid } },
        y: { title: { display: true, text: name }, grid: { color: C.grid } } } }) };
    },
    validations(d) {
      const palette = ["#e8590c", "#2f9e44", "#ae3ec9", "#1098ad", "#f08c00", "#d6336c", "#5c940d", "#868e96"];
      const sets = [{ type: "line", label: "val", data: d.validations.map((v) => ({ x: v.step, y: v.score })),
        borderColor: C.best, backgroundColor: C.best, borderWidth: 3, pointRadius: 4 }];
      d.categories.forEach((cat, i) => sets.push({ type: "line", label: cat, borderWidth: 1, pointRadius: 2,
        data: d.validations.map((v) => ({ x: v.step, y: v.by_task_type[cat] === undefined ? null : v.by_task_type[cat] })),
        borderColor: palette[i % palette.length], backgroundColor: palette[i % palette.length] }));
      const gated = d.evolutions.filter((e) => e.candidate_score !== null);
      if (gated.length) {
        sets.push(marker("evolved bank kept", gated.filter((e) => e.accepted).map((e) => ({ x: e.step, y: e.candidate_score })),
          "star", C.acceptBest, 9));
        sets.push(marker("evolved bank not kept", gated.filter((e) => !e.accepted).map((e) => ({ x: e.step, y: e.candidate_score })),
          "crossRot", C.reject, 6));
      }
      return { data: { datasets: sets }, options: base({ scales: {
        x: { type: "linear", min: 0, title: { display: true, text: "step" }, ticks: { precision: 0 }, grid: { color: C.grid } },
        y: { suggestedMin: 0, suggestedMax: 1, title: { display: true, text: "val score" }, grid: { color: C.grid } } } }) };
    },
  };
  Object.assign(builders, policyBuilders);

  function base(extra) {
    return Object.assign({ responsive: true, maintainAspectRatio: false, animation: false, normalized: true,
      interaction: { mode: "nearest", intersect: false },
      plugins: Object.assign({ legend: { position: "bottom", labels: { usePointStyle: true, boxWidth: 8 } } }, extra.plugins || {}) },
    Object.fromEntries(Object.entries(extra).filter(([k]) => k !== "plugins")));
  }

  function draw(canvas) {
    const data = readJSON(canvas.dataset.source);
    if (!data || !window.Chart) return;
    if (charts[canvas.id]) charts[canvas.id].destroy();
    const config = builders[canvas.dataset.chart](data, canvas);
    config.type = config.type || "scatter";
    charts[canvas.id] = new window.Chart(canvas, config);
  }

  function drawAll() { document.querySelectorAll("canvas[data-chart]").forEach(draw); }

  /* --- live updates ------------------------------------------------------- */

  function initLive() {
    let version = document.body.dataset.liveVersion;
    if (!version) return;
    const scope = document.body.dataset.liveScope || "";
    const indicator = document.getElementById("live-indicator");
    if (indicator) indicator.hidden = false;
    async function tick() {
      try {
        const answer = await fetch("/api/version?runs=" + encodeURIComponent(scope), { cache: "no-store" });
        const now = (await answer.json()).version;
        if (now && now !== version) {
          const page = await fetch(window.location.href, { cache: "no-store" });
          const doc = new DOMParser().parseFromString(await page.text(), "text/html");
          document.querySelectorAll("[data-live][id]").forEach((old) => {
            const fresh = doc.getElementById(old.id);
            if (fresh) old.replaceWith(document.importNode(fresh, true));
          });
          version = now;
          document.body.dataset.liveVersion = now;
          drawAll();
          if (indicator) indicator.textContent = "live · updated " + new Date().toLocaleTimeString();
        }
      } catch (err) {
        if (indicator) indicator.textContent = "live · reconnecting";
      }
      window.setTimeout(tick, POLL_MS);
    }
    window.setTimeout(tick, POLL_MS);
  }

  /* --- why is this sentence here ------------------------------------------ */

  const whyCache = new Map();

  function section(title) {
    const box = el("div", "why-section");
    box.appendChild(el("h3", null, title));
    return box;
  }

  function stepLink(run, step, text) {
    const a = el("a", null, text);
    a.href = "/runs/" + encodeURIComponent(run) + "/steps/" + step;
    return a;
  }

  function renderSkillWhy(run, info, body) {
    if (!info.found) {
      body.appendChild(el("p", "muted", "This text is not in the run's skills: nothing in the log explains it."));
      return;
    }
    if (info.in_trained_files && info.in_trained_files.length) {
      body.appendChild(el("p", "muted", "In " + info.in_trained_files.join(", ") + " of the current skill."));
    }
    if (!info.changes.length && info.in_initial_skill) {
      body.appendChild(el("p", null, "It was in the initial skill, and no step has changed that."));
      return;
    }
    const hist = section("History");
    const list = el("ul", "why-list");
    info.changes.forEach((c) => {
      const li = el("li");
      li.appendChild(el("strong", null, c.change + " "));
      li.appendChild(c.by === "step" ? stepLink(run, c.step, "at step " + c.step) : el("span", null, "by the slow update of epoch " + c.epoch));
      li.appendChild(el("span", null, " (epoch " + c.epoch + "): "));
      li.appendChild(el("span", "dec " + c.decision, String(c.decision).replace("_", " ")));
      if (c.reason) li.appendChild(el("span", "muted", " · " + c.reason));
      list.appendChild(li);
    });
    hist.appendChild(list);
    body.appendChild(hist);
    const o = info.origin;
    if (!o) return;
    if (o.slow_update_epoch !== undefined) {
      const s = section("Slow update of epoch " + o.slow_update_epoch);
      s.appendChild(el("p", null, o.reasoning || ""));
      body.appendChild(s);
      return;
    }
    if (o.kept_edits && o.kept_edits.length) {
      const s = section("The kept edit" + (o.kept_edits.length > 1 ? "s" : ""));
      o.kept_edits.forEach((e) => {
        const p = el("div", "edit");
        p.appendChild(el("span", "op", e.op));
        if (e.status) p.appendChild(el("span", "apply " + e.status, " " + e.status));
        p.appendChild(el("span", "muted", " support " + e.support + " · from the " + e.source + " side"));
        p.appendChild(el("pre", "content", e.content));
        s.appendChild(p);
      });
      body.appendChild(s);
    }
    (o.proposed_by || []).forEach((a) => {
      const s = section("Analyst: " + a.source + ", minibatch " + a.minibatch);
      if (a.failure_summary && a.failure_summary.length) {
        const ul = el("ul", "why-list");
        a.failure_summary.forEach((f) => ul.appendChild(el("li", null, f)));
        s.appendChild(ul);
      }
      const shown = (a.items || []).filter((i) => i.hard < 1);
      if (shown.length) {
        s.appendChild(el("div", "muted", "the failures it saw (" + shown.length + "):"));
        const ul = el("ul", "why-list");
        shown.slice(0, 8).forEach((i) => {
          const li = el("li", "fail");
          li.appendChild(el("span", "mono", i.item_id + " "));
          li.appendChild(el("span", null, i.task_type + ": " + (i.fail_reason || "failed")));
          ul.appendChild(li);
        });
        if (shown.length > 8) ul.appendChild(el("li", "muted", "and " + (shown.length - 8) + " more"));
        s.appendChild(ul);
      }
      body.appendChild(s);
    });
  }

  function renderBankWhy(run, info, body) {
    if (!info.found) {
      body.appendChild(el("p", "muted", "No skill of the bank matches this text."));
      return;
    }
    info.skills.forEach((k) => {
      const s = section(k.title);
      s.appendChild(el("p", null, k.principle));
      const meta = el("p", "muted");
      meta.appendChild(el("span", null, "added by " + k.event + " (" + k.origin + ") at "));
      meta.appendChild(stepLink(run, k.step, "step " + k.step));
      meta.appendChild(el("span", null, " · shown in " + k.rollouts_shown + " rollouts"));
      s.appendChild(meta);
      if (k.gate) s.appendChild(el("p", null, "gate: " + k.gate.decision + " · " + k.gate.reason));
      if (k.trajectories.length) {
        const ul = el("ul", "why-list");
        k.trajectories.slice(0, 8).forEach((t) => ul.appendChild(el("li", "fail", t.id + ": " + t.outcome)));
        s.appendChild(ul);
      }
      body.appendChild(s);
    });
  }

  async function showWhy(target) {
    const panel = document.getElementById("why-panel");
    const body = document.getElementById("why-body");
    if (!panel || !body) return;
    const run = panel.dataset.run;
    const text = target.dataset.text || "";
    document.querySelectorAll(".sentence.picked").forEach((n) => n.classList.remove("picked"));
    target.classList.add("picked");
    body.replaceChildren(el("blockquote", "why-quote", text), el("p", "muted", "looking it up in the log…"));
    let info = whyCache.get(text);
    try {
      if (!info) {
        const answer = await fetch("/api/runs/" + encodeURIComponent(run) + "/why?text=" + encodeURIComponent(text));
        info = await answer.json();
        if (!answer.ok) throw new Error(info.error || answer.statusText);
        whyCache.set(text, info);
      }
    } catch (err) {
      body.replaceChildren(el("blockquote", "why-quote", text), el("p", "err", String(err.message || err)));
      return;
    }
    if (!target.classList.contains("picked")) return; // another sentence was picked meanwhile
    body.replaceChildren(el("blockquote", "why-quote", text));
    (info.bank ? renderBankWhy : renderSkillWhy)(run, info, body);
  }

  function initWhy() {
    let timer = null;
    document.addEventListener("click", (e) => {
      const s = e.target.closest && e.target.closest(".sentence");
      if (s) showWhy(s);
    });
    document.addEventListener("keydown", (e) => {
      const s = e.target.closest && e.target.closest(".sentence");
      if (s && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); showWhy(s); }
    });
    document.addEventListener("mouseover", (e) => {
      const s = e.target.closest && e.target.closest(".sentence");
      window.clearTimeout(timer);
      if (s && !s.classList.contains("picked")) timer = window.setTimeout(() => showWhy(s), 350);
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    if (window.Chart) {
      window.Chart.defaults.font.family = getComputedStyle(document.body).fontFamily;
      window.Chart.defaults.color = "#4a5263";
    }
    drawAll();
    initLive();
    initWhy();
  });
})();
