// budgetbench's per-cell viewer. Renders #cell=N (a cell's items) and #item=TASK/ID (every
// cell of one item side by side) from the page's JSON block, on demand. Every text from
// the records goes in through textContent, never as markup. The page's CSP allows this
// script by its sha256 and nothing else.
(function () {
  "use strict";
  var data = null;
  var itemIndex = null;
  var panel = document.getElementById("bb-viewer");
  if (!panel) { return; }

  function load() {
    if (data === null) {
      data = JSON.parse(document.getElementById("bb-data").textContent);
      itemIndex = new Map();
      data.items.forEach(function (item, i) { itemIndex.set(item.key, i); });
    }
    return data;
  }

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    return node;
  }

  function link(href, text) {
    var a = el("a", null, text);
    a.setAttribute("href", href);
    return a;
  }

  function fmt(value, digits) {
    if (value === undefined || value === null) { return ""; }
    return typeof value === "number" ? value.toFixed(digits) : String(value);
  }

  function shown(value) {
    if (value === undefined || value === null) { return ""; }
    return typeof value === "string" ? value : JSON.stringify(value);
  }

  function cellLabel(cell) {
    return (cell.side ? cell.side + " " : "") + cell.strategy + "@" + cell.budget;
  }

  function itemHref(item) { return "#item=" + encodeURIComponent(item.key); }

  // An item's mean quality in one cell over its scored repeats, or null.
  function quality(item, cell) {
    var sum = 0, n = 0;
    item.rows.forEach(function (row) {
      if (row.c === cell && row.s === "ok" && typeof row.q === "number") { sum += row.q; n += 1; }
    });
    return n ? sum / n : null;
  }

  // Merged over repeats as the tables merge them: admitted if any was, else violation.
  function statusOf(item, cell) {
    var seen = new Set();
    item.rows.forEach(function (row) { if (row.c === cell) { seen.add(row.s); } });
    if (seen.has("ok")) { return "ok"; }
    return seen.has("violation") ? "violation" : (seen.size ? "error" : null);
  }

  function versus(item, cell) {
    var ref = data.cells[cell].ref;
    if (ref === null || ref === undefined) { return "no reference"; }
    var mine = quality(item, cell), theirs = quality(item, ref);
    if (mine === null || theirs === null) { return "unpaired"; }
    return mine > theirs ? "win" : (mine < theirs ? "loss" : "tie");
  }

  function clear() {
    while (panel.firstChild) { panel.removeChild(panel.firstChild); }
    panel.hidden = false;
  }

  function header(title, back) {
    var bar = el("div", "bb-bar");
    bar.appendChild(el("h2", null, title));
    if (back) { bar.appendChild(back); }
    var close = link("#", "close viewer");
    close.className = "bb-close";
    bar.appendChild(close);
    panel.appendChild(bar);
    if (data.note) { panel.appendChild(el("p", "note", data.note)); }
  }

  function select(label, values, onChange) {
    var wrap = el("label", "bb-filter", label + " ");
    var box = el("select");
    values.forEach(function (v) { var o = el("option", null, v); o.value = v; box.appendChild(o); });
    box.addEventListener("change", onChange);
    wrap.appendChild(box);
    return { node: wrap, box: box };
  }

  // -- a cell: its items, with filters --------------------------------------------------
  function showCell(cellIndex) {
    var cell = data.cells[cellIndex];
    if (!cell) { return missing("no cell " + cellIndex); }
    clear();
    header(cell.task + ": " + cellLabel(cell) + (cell.reference ? " (reference)" : ""));
    var items = data.items.filter(function (item) {
      return item.rows.some(function (row) { return row.c === cellIndex; });
    });
    var ref = cell.ref;
    panel.appendChild(el("p", "note", items.length + " items" + (ref !== null && ref !== undefined
      ? "; wins and losses against " + cellLabel(data.cells[ref]) : "")));
    var categories = ["all"].concat(Array.from(new Set(items.map(function (i) {
      return String(i.category);
    }))).sort());
    var filters = el("div", "bb-filters");
    var byCategory = select("category", categories, draw);
    var byStatus = select("status", ["all", "ok", "violation", "error"], draw);
    var byVersus = select("vs reference", ["all", "win", "loss", "tie", "unpaired"], draw);
    [byCategory, byStatus, byVersus].forEach(function (f) { filters.appendChild(f.node); });
    panel.appendChild(filters);
    var count = el("p", "note");
    panel.appendChild(count);
    var holder = el("div", "scroll");
    panel.appendChild(holder);

    function draw() {
      var table = el("table");
      var head = el("tr");
      ["item", "category", "status", "quality", "reference quality", "vs reference", "tokens",
        "extracted", "reply"].forEach(function (h) { head.appendChild(el("th", null, h)); });
      var thead = el("thead");
      thead.appendChild(head);
      table.appendChild(thead);
      var body = el("tbody");
      var shownCount = 0;
      items.forEach(function (item) {
        var status = statusOf(item, cellIndex), vs = versus(item, cellIndex);
        if (byCategory.box.value !== "all" && String(item.category) !== byCategory.box.value) { return; }
        if (byStatus.box.value !== "all" && status !== byStatus.box.value) { return; }
        if (byVersus.box.value !== "all" && vs !== byVersus.box.value) { return; }
        shownCount += 1;
        var row = item.rows.find(function (r) { return r.c === cellIndex; });
        var tr = el("tr");
        var first = el("td", "t");
        first.appendChild(link(itemHref(item), item.item));
        tr.appendChild(first);
        tr.appendChild(el("td", "t", item.category));
        tr.appendChild(el("td", "t bb-" + status, status));
        tr.appendChild(el("td", null, fmt(quality(item, cellIndex), 3)));
        tr.appendChild(el("td", null, ref === null || ref === undefined ? "" : fmt(quality(item, ref), 3)));
        tr.appendChild(el("td", "t bb-" + vs, vs));
        tr.appendChild(el("td", null, fmt(row.t, 0)));
        tr.appendChild(el("td", "t bb-clip", row.x));
        tr.appendChild(el("td", "t bb-clip", row.y || row.e));
        body.appendChild(tr);
      });
      table.appendChild(body);
      count.textContent = shownCount + " shown";
      while (holder.firstChild) { holder.removeChild(holder.firstChild); }
      holder.appendChild(table);
    }
    draw();
    panel.scrollTop = 0;
  }

  // -- an item: every cell side by side -------------------------------------------------
  function showItem(key) {
    var index = itemIndex.get(key);
    if (index === undefined) { return missing("item " + key + " is not in the viewer"); }
    var item = data.items[index];
    clear();
    header(item.task + " / " + item.item);
    var facts = el("dl");
    [["category", item.category], ["gold", shown(item.gold)],
      ["full history", item.full ? item.full.length + " messages (a reference cell's prompt)"
        : "not recorded (no reference cell's prompt was kept)"]].forEach(function (pair) {
      facts.appendChild(el("dt", null, pair[0]));
      facts.appendChild(el("dd", "bb-pre", pair[1]));
    });
    panel.appendChild(facts);
    // Columns by budget, then in the summary's strategy order: one budget's strategies
    // stand next to each other. Filters narrow them to a strategy or a budget.
    var rows = item.rows.slice().sort(function (a, b) {
      return (data.cells[a.c].budget - data.cells[b.c].budget) || (a.c - b.c) || (a.r - b.r);
    });
    function distinct(name) {
      return ["all"].concat(Array.from(new Set(rows.map(function (row) {
        return String(data.cells[row.c][name]);
      }))));
    }
    var filters = el("div", "bb-filters");
    var bySide = select("run", distinct("side"), draw);
    var byStrategy = select("strategy", distinct("strategy"), draw);
    var byBudget = select("budget", distinct("budget"), draw);
    if (bySide.box.options.length > 2) { filters.appendChild(bySide.node); }
    filters.appendChild(byStrategy.node);
    filters.appendChild(byBudget.node);
    panel.appendChild(filters);
    var columns = el("div", "bb-cols");
    panel.appendChild(columns);

    function draw() {
      while (columns.firstChild) { columns.removeChild(columns.firstChild); }
      rows.forEach(function (row) {
        var cell = data.cells[row.c];
        if ([[bySide, "side"], [byStrategy, "strategy"], [byBudget, "budget"]].some(function (f) {
          return f[0].box.value !== "all" && String(cell[f[1]]) !== f[0].box.value;
        })) { return; }
        columns.appendChild(column(item, row));
      });
    }
    draw();
    panel.scrollTop = 0;
  }

  function column(item, row) {
    var cell = data.cells[row.c];
    var col = el("div", "bb-col");
    var title = el("h3");
    title.appendChild(link("#cell=" + row.c, cellLabel(cell) + (row.r ? " r" + row.r : "")));
    col.appendChild(title);
    var facts = el("dl");
    function fact(name, value) {
      if (value === "" || value === undefined || value === null) { return; }
      facts.appendChild(el("dt", null, name));
      facts.appendChild(el("dd", name === "status" ? "bb-" + value : null, value));
    }
    fact("status", row.s);
    fact("quality", fmt(row.q, 3));
    fact("grader", row.g);
    fact("extracted", row.x);
    fact("gold", shown(item.gold));
    fact("tokens", [fmt(row.t, 0), row.st !== undefined ? "server " + row.st : "",
      row.o !== undefined ? "out " + row.o : ""].filter(Boolean).join(" · "));
    fact("utilisation", row.u !== undefined ? (100 * row.u).toFixed(1) + "%" : "");
    // Evidence spans the prompt held verbatim (an episode's: its last call's).
    fact("evidence kept", row.et !== undefined ? row.ek + " of " + row.et + (row.er !== undefined
      ? " (" + (100 * row.er).toFixed(1) + "%)" : "") : "");
    // The gold answer (as the grader normalises it) outside the question, where the
    // evidence holds it; "not unique" where the history holds it elsewhere too.
    fact("answer kept", answerKept(row.ak, row.au));
    fact("strategy s", fmt(row.ss, 3));
    fact("model s", fmt(row.ms, 3) + (row.ca ? " (cached)" : ""));
    if (row.aux) {
      fact("aux calls", (row.auxn || row.aux.length) + " · in " + (row.ai || 0) + " · out "
        + (row.ao || 0) + " · " + fmt(row.as, 3) + " s");
    }
    if (row.nc !== undefined) {
      fact("calls", row.nc + (row.en ? " · ended " + row.en : "")
        + (row.vc ? " · violated at call " + row.vc : ""));
      fact("call tokens", [["max", row.mx], ["p95", row.p95], ["sum", row.sm],
        ["prompt+output over all calls", row.tt]].filter(function (pair) {
        return pair[1] !== undefined;
      }).map(function (pair) { return pair[0] + " " + fmt(pair[1], 0); }).join(" · "));
      fact("per call", row.ct ? row.ct.join(" · ") : "");
      fact("prefix reuse", row.pr !== undefined ? (100 * row.pr).toFixed(1) + "%" : "");
    }
    fact("cell", row.id);
    col.appendChild(facts);
    if (row.y !== undefined) { col.appendChild(block("reply", row.y)); }
    if (row.e !== undefined) { col.appendChild(block("error", row.e)); }
    if (row.aux) { col.appendChild(auxTable(row.aux)); }
    if (row.nc !== undefined) { col.appendChild(episode(item, row)); }
    // An episode's prompts are its calls'; prompts.jsonl may hold none for it.
    if (row.nc === undefined || row.pm !== "none") { col.appendChild(prompt(item, row)); }
    return col;
  }

  function block(name, text) {
    var wrap = el("div", "bb-block");
    wrap.appendChild(el("div", "bb-label", name));
    wrap.appendChild(el("pre", "bb-pre bb-" + name, text));
    return wrap;
  }

  function auxTable(calls) {
    var details = el("details", "bb-aux");
    details.appendChild(el("summary", null, "auxiliary calls (" + calls.length + ")"));
    var table = el("table");
    var head = el("tr");
    ["purpose", "model", "in", "out", "s", "cached"].forEach(function (h) {
      head.appendChild(el("th", null, h));
    });
    table.appendChild(head);
    calls.forEach(function (call) {
      var tr = el("tr");
      [call.purpose, call.model, call.input_tokens, call.output_tokens, fmt(call.latency_s, 3),
        call.cached ? "yes" : ""].forEach(function (v) { tr.appendChild(el("td", "t", shown(v))); });
      table.appendChild(tr);
    });
    details.appendChild(table);
    return details;
  }

  var NOT_KEPT = {
    hash: "prompt not kept: the run's audit kept its sha256 only (--budgetbench-audit=hash)",
    none: "prompt not recorded (--budgetbench-audit=off, or no prompts.jsonl)",
    cap: "prompt left out of this page (size cap; see the note above)"
  };

  function prompt(item, row) {
    var wrap = el("div", "bb-prompt");
    if (!row.p) {
      wrap.appendChild(el("p", "note", NOT_KEPT[row.pm] || NOT_KEPT.none));
      if (row.sha) { wrap.appendChild(el("p", "note bb-pre", "sha256 " + row.sha)); }
      return wrap;
    }
    var full = item.full ? new Set(item.full) : null;
    var mine = new Set(row.p);
    var kept = 0;
    row.p.forEach(function (i) { if (full && full.has(i)) { kept += 1; } });
    var dropped = full ? item.full.filter(function (i) { return !mine.has(i); }) : [];
    var summary = "prompt: " + row.p.length + " messages";
    if (full) {
      summary += " · " + kept + " kept · " + (row.p.length - kept) + " new · " + dropped.length
        + " dropped of " + item.full.length;
    }
    wrap.appendChild(el("div", "bb-label", summary));
    if (row.ev) { wrap.appendChild(evidence(row.ev)); }
    var hits = (row.ev || []).filter(function (m) { return m[1] && m[0]; }).map(function (m) {
      return m[0];
    });
    row.p.forEach(function (i) {
      var mark = full ? (full.has(i) ? "kept" : "new") : "";
      wrap.appendChild(message(item, item.msgs[i], mark, hits));
    });
    if (dropped.length) {
      var details = el("details", "bb-dropped");
      details.appendChild(el("summary", null, dropped.length + " dropped from the full history"));
      dropped.forEach(function (i) { details.appendChild(message(item, item.msgs[i], "dropped")); });
      wrap.appendChild(details);
    }
    return wrap;
  }

  // The item's evidence spans, each marked kept (the prompt holds it verbatim) or dropped.
  function evidence(marks) {
    var kept = marks.filter(function (m) { return m[1]; }).length;
    var wrap = el("div", "bb-evidence");
    wrap.appendChild(el("div", "bb-label", "evidence: " + kept + " of " + marks.length
      + " spans kept verbatim"));
    marks.forEach(function (m) {
      var line = el("div", "bb-ev " + (m[1] ? "bb-ev-kept" : "bb-ev-dropped"));
      line.appendChild(el("span", "bb-ev-tag", m[1] ? "\u2713 kept" : "\u2717 dropped"));
      line.appendChild(el("span", "bb-pre", m[0]));
      wrap.appendChild(line);
    });
    return wrap;
  }

  // A text with each kept evidence span it holds highlighted (a <mark>), built from text
  // nodes only; the earliest span first, the longest where two start together.
  function highlighted(cls, text, spans) {
    var pre = el("pre", cls);
    var at = 0;
    for (;;) {
      var best = -1, size = 0;
      (spans || []).forEach(function (span) {
        var i = text.indexOf(span, at);
        if (i !== -1 && (best === -1 || i < best || (i === best && span.length > size))) {
          best = i;
          size = span.length;
        }
      });
      if (best === -1) { break; }
      pre.appendChild(document.createTextNode(text.slice(at, best)));
      pre.appendChild(el("mark", "bb-ev-hit", text.slice(best, best + size)));
      at = best + size;
    }
    pre.appendChild(document.createTextNode(text.slice(at)));
    return pre;
  }

  // A message as what it is: text, an assistant's tool calls (name and arguments), or a
  // tool result tied to the id of the call it answers; never a tool result as plain text.
  // ``hits``: kept evidence spans to highlight in its text (none outside a cell's prompt).
  function message(item, msg, mark, hits) {
    var role = msg[0], text = msg[1], tool = msg[2] || {};
    var kind = tool.calls ? " bb-call" : (tool.call !== undefined ? " bb-result" : "");
    var details = el("details", "bb-msg" + kind + (mark ? " bb-" + mark : ""));
    var head = role + (mark ? " · " + mark : "") + " · ";
    if (tool.calls) {
      head += "calls " + tool.calls.map(function (c) { return c[1]; }).join(", ")
        + (text ? " · " : "");
    } else if (tool.call !== undefined) {
      head = "tool result" + (mark ? " · " + mark : "") + " · of call " + tool.call + " ("
        + (tool.name || callNames(item).get(tool.call) || "?") + ") · ";
    }
    details.appendChild(el("summary", null, head + text.slice(0, 90).replace(/\s+/g, " ")));
    if (tool.call !== undefined) {
      details.appendChild(el("div", "bb-tool-head", "result of call " + tool.call + " ("
        + (tool.name || callNames(item).get(tool.call) || "unknown call") + ")"));
    }
    if (text) { details.appendChild(highlighted("bb-pre", text, hits)); }
    (tool.calls || []).forEach(function (call) {
      details.appendChild(el("div", "bb-tool-head", "call " + call[0] + ": " + call[1]));
      details.appendChild(el("pre", "bb-pre bb-args", call[2]));
    });
    return details;
  }

  // The item's call ids and the tools they call, from its messages (once per item).
  function callNames(item) {
    if (!item.callNames) {
      item.callNames = new Map();
      item.msgs.forEach(function (msg) {
        ((msg[2] || {}).calls || []).forEach(function (c) { item.callNames.set(c[0], c[1]); });
      });
    }
    return item.callNames;
  }

  // -- an episode: the trajectory call by call -------------------------------------------
  var NO_EPISODE = {
    none: "episode not recorded (no record of this cell in episodes.jsonl)",
    cap: "episode left out of this page (size cap; see the note above)"
  };

  function episode(item, row) {
    var wrap = el("div", "bb-episode");
    var ep = row.ep;
    if (!ep) {
      wrap.appendChild(el("p", "note", NO_EPISODE[row.em] || NO_EPISODE.none));
      return wrap;
    }
    var budget = data.cells[row.c].budget;
    var total = ep.callsn || ep.calls.length;
    wrap.appendChild(el("div", "bb-label", "episode: " + total + " calls"
      + (ep.ended ? " · ended " + ep.ended : "")
      + (row.vc ? " · call " + row.vc + " violated the budget" : "")));
    if (ep.tools.length) { wrap.appendChild(el("p", "note", "tools: " + ep.tools.join(", "))); }
    if (ep.callsn) {
      wrap.appendChild(el("p", "note", "the first " + ep.calls.length + " of " + ep.callsn
        + " calls are shown"));
    }
    ep.calls.forEach(function (call) { wrap.appendChild(step(item, call, row, budget)); });
    var trajectory = el("details", "bb-trajectory");
    trajectory.appendChild(el("summary", null, "trajectory (" + ep.traj.length + " messages)"));
    ep.traj.forEach(function (i) { trajectory.appendChild(message(item, item.msgs[i], "")); });
    wrap.appendChild(trajectory);
    return wrap;
  }

  // answer_kept and answer_unique as words ("" where the row has none).
  function answerKept(kept, unique) {
    if (kept === undefined) { return ""; }
    return (kept ? "yes" : "no") + (unique === false ? " (not unique: the history holds it "
      + "outside the evidence too)" : "");
  }

  // One call: the prompt as sent (trajectory messages kept, the strategy's new ones), the
  // trajectory messages it dropped, its counted tokens against the budget.
  function step(item, call, row, budget) {
    var violated = row.vc !== undefined && call.k === row.vc;
    var over = typeof call.t === "number" && call.t > budget;
    var details = el("details", "bb-step" + (violated ? " bb-violated" : ""));
    if (violated) { details.open = true; }
    var made = new Set(call.n);
    var summary = "call " + call.k + " · " + fmt(call.t, 0) + " tokens" + (over ? " (over "
      + budget + ")" : "") + " · sent " + call.p.length + " (" + (call.p.length - made.size)
      + " kept, " + made.size + " new) · dropped " + call.d.length
      + (violated ? " · VIOLATION" : "") + (call.ca ? " · cached" : "")
      + (call.sx !== undefined ? " · step " + call.sp + ": " + (call.sx ? "✓ exact" : "✗ exact")
         + ", " + (call.sn ? "✓ name" : "✗ name") : "");
    details.appendChild(el("summary", violated || over ? "bb-violation" : null, summary));
    details.appendChild(el("p", "note", [
      call.st !== undefined ? "server " + call.st : "", call.o !== undefined ? "out " + call.o : "",
      call.ms !== undefined ? fmt(call.ms, 3) + " s" : "",
      call.nt !== undefined ? call.nt + " tools" : "",
      call.et !== undefined ? "evidence kept " + call.ek + " of " + call.et : "",
      call.ak !== undefined ? "answer kept: " + answerKept(call.ak, call.au) : "",
      "made after " + call.seen + " trajectory messages"].filter(Boolean).join(" · ")));
    if (call.ev) { details.appendChild(evidence(call.ev)); }  // spans shown by this call
    call.p.forEach(function (i, at) {
      details.appendChild(message(item, item.msgs[i], made.has(at) ? "new" : "kept"));
    });
    if (call.pr !== undefined) {  // teacher-forced: the model's prediction at this step
      details.appendChild(message(item, item.msgs[call.pr], "predicted"));
    }
    if (call.d.length) {
      var dropped = el("details", "bb-dropped");
      dropped.appendChild(el("summary", null, call.d.length + " dropped from the trajectory"));
      call.d.forEach(function (i) { dropped.appendChild(message(item, item.msgs[i], "dropped")); });
      details.appendChild(dropped);
    }
    return details;
  }

  function missing(text) {
    clear();
    header("viewer");
    panel.appendChild(el("p", "note", text));
  }

  function route() {
    var hash = location.hash.slice(1);
    if (hash.indexOf("cell=") === 0) {
      load();
      showCell(Number(hash.slice(5)));
    } else if (hash.indexOf("item=") === 0) {
      load();
      showItem(decodeURIComponent(hash.slice(5)));
    } else {
      panel.hidden = true;
    }
  }

  // Without JavaScript, #cell=N is the id of that cell's item table; with it, the panel
  // (an overlay) shows the cell, and the page behind must not scroll to the table.
  Array.prototype.forEach.call(document.querySelectorAll("details.bb-cell"), function (d) {
    d.removeAttribute("id");
  });
  window.addEventListener("hashchange", route);
  route();
}());
