// The sandgate console: a client of the REST API like any other. The key
// (an API key or a JWT) is kept in this tab's sessionStorage only; every
// call sends it as a bearer token, and the terminal's WebSocket, which a
// browser cannot give a header, uses a one-use ticket got with it.
(function () {
  "use strict";

  // xterm.js's DOM renderer makes <style> elements for its cell sizes and
  // colours; the page's Content-Security-Policy admits them only with the
  // page's nonce, which this stamps on every style element made here.
  const NONCE = document.currentScript ? document.currentScript.nonce : "";
  const makeElement = document.createElement.bind(document);
  document.createElement = function (tag, options) {
    const el = makeElement(tag, options);
    if (NONCE && String(tag).toLowerCase() === "style") el.nonce = NONCE;
    return el;
  };

  const KEY = "sandgate.token";
  const ROOT = new URL("../", location.href); // the gateway's base, whatever prefix it is served under
  const $ = (id) => document.getElementById(id);
  const enc = new TextEncoder();
  let token = sessionStorage.getItem(KEY);
  let page = null; // the open session page
  let listTimer = 0;
  let sessions = [];

  class APIError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function errorOf(res) {
    let code = "", message = res.statusText || "HTTP " + res.status;
    try {
      const j = await res.json();
      if (j && j.error) ({ code, message } = j.error);
    } catch (_) { /* not the envelope */ }
    return new APIError(res.status, code, message);
  }

  // api calls the REST API with the key; opts.raw returns the Response.
  async function api(method, path, body, opts = {}) {
    const headers = { Authorization: "Bearer " + token };
    let payload;
    if (body instanceof Blob) {
      headers["Content-Type"] = "application/octet-stream";
      payload = body;
    } else if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      payload = JSON.stringify(body);
    }
    const res = await fetch(new URL(path, ROOT), { method, headers, body: payload, signal: opts.signal });
    if (!res.ok) {
      const err = await errorOf(res);
      if (res.status === 401) signOut("The gateway refused the key: " + err.message + ". Sign in again.");
      throw err;
    }
    if (opts.raw) return res;
    if (res.status === 204) return null;
    return (res.headers.get("Content-Type") || "").includes("json") ? res.json() : res.text();
  }

  const sid = (id) => "v1/sessions/" + encodeURIComponent(id);

  // ---- formatting ----
  function dur(ms) {
    if (!isFinite(ms)) return "";
    const neg = ms < 0;
    let s = Math.floor(Math.abs(ms) / 1000);
    let out;
    if (s < 60) out = s + "s";
    else if (s < 3600) out = Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
    else if (s < 86400) out = Math.floor(s / 3600) + "h" + String(Math.floor(s / 60) % 60).padStart(2, "0") + "m";
    else out = Math.floor(s / 86400) + "d" + Math.floor(s / 3600) % 24 + "h";
    return neg ? "-" + out : out;
  }
  function bytes(n) {
    if (n == null) return "";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(n)) + " " + u[i];
  }
  function labels(m) {
    if (!m) return "";
    return Object.keys(m).map((k) => k + "=" + (typeof m[k] === "string" ? m[k] : JSON.stringify(m[k]))).join(", ");
  }
  function el(tag, text, cls) {
    const e = makeElement(tag);
    if (text != null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function button(text, act, id, label) {
    const b = el("button", text);
    b.type = "button";
    b.dataset.act = act;
    if (id != null) b.dataset.id = id;
    if (label) b.setAttribute("aria-label", label);
    return b;
  }

  // ---- messages ----
  function status(msg) { $("status").textContent = msg || ""; }
  function showError(msg) {
    const e = $("error");
    e.textContent = msg;
    e.hidden = !msg;
  }
  function fail(what) {
    return (err) => {
      if (err && err.name === "AbortError") return;
      showError(what + ": " + (err && err.message ? err.message : err) + (err && err.code ? " (" + err.code + ")" : ""));
    };
  }
  // confirmTwice turns a destructive button into "Confirm …" for a few
  // seconds; the second press does it. No modal dialog.
  function confirmTwice(b) {
    if (b.dataset.armed) return true;
    b.dataset.armed = "1";
    const text = b.textContent;
    b.textContent = "Confirm " + text.toLowerCase();
    setTimeout(() => { delete b.dataset.armed; b.textContent = text; }, 4000);
    return false;
  }

  // ---- sign in and out ----
  $("signin-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const t = $("token").value.trim();
    showError("");
    status("Signing in…");
    try {
      const res = await fetch(new URL("v1/sessions?limit=1", ROOT), { headers: { Authorization: "Bearer " + t } });
      if (!res.ok) {
        const err = await errorOf(res);
        status("");
        showError("Sign-in failed: " + err.message + (err.code ? " (" + err.code + ")" : ""));
        $("token").focus();
        $("token").select(); // typing replaces the refused key
        return;
      }
    } catch (err) {
      status("");
      showError("Cannot reach the gateway: " + err.message);
      return;
    }
    token = t;
    sessionStorage.setItem(KEY, t);
    $("token").value = "";
    status("");
    route();
  });

  function signOut(msg) {
    sessionStorage.removeItem(KEY);
    token = null;
    closePage();
    stopList();
    if (location.hash && location.hash !== "#/") history.replaceState(null, "", "#/");
    route();
    if (msg) showError(msg);
  }
  $("signout").addEventListener("click", () => signOut(""));

  // ---- routing ----
  function show(which) {
    for (const s of ["signin", "list", "session"]) $(s).hidden = s !== which;
    $("signout").hidden = which === "signin";
    $("nav-sessions").hidden = which === "signin";
  }

  function route() {
    showError("");
    if (!token) {
      closePage();
      stopList();
      show("signin");
      document.title = "Sign in · sandgate console";
      $("token").focus();
      return;
    }
    const m = /^#\/s\/([^/]+)(?:\/record\/(\d+))?$/.exec(location.hash);
    if (m) {
      let id;
      try {
        id = decodeURIComponent(m[1]);
      } catch (_) { // a malformed escape in a typed or pasted address
        closePage();
        openList();
        showError("The address names no session: " + m[1]);
        return;
      }
      stopList();
      openSession(id, m[2] ? Number(m[2]) : 0);
      return;
    }
    closePage();
    openList();
  }
  window.addEventListener("hashchange", route);

  // ---- the sessions list ----
  // The list reads its first page of 100 every 5 s; the More button adds
  // a page to what it reads (a gateway's rate limit is per principal).
  const LIST_PAGE = 100;
  let listLimit = LIST_PAGE;
  let listTotal = 0;
  async function loadSessions() {
    const all = [];
    for (let offset = 0; offset < listLimit;) {
      const p = await api("GET", "v1/sessions?limit=" + Math.min(LIST_PAGE, listLimit - offset) + "&offset=" + offset);
      all.push(...p.sessions);
      listTotal = p.total;
      offset += p.sessions.length;
      if (!p.sessions.length || offset >= p.total) break;
    }
    return all;
  }
  $("list-more").addEventListener("click", () => {
    listLimit += LIST_PAGE;
    refreshList();
  });

  function openList() {
    const was = !$("list").hidden;
    show("list");
    // A new view: the keyboard and a screen reader start at its heading.
    if (!was) $("list-h").focus();
    document.title = "Sessions · sandgate console";
    refreshList();
    if (!listTimer) listTimer = setInterval(() => { if (!document.hidden) refreshList(); }, 5000);
  }
  function stopList() {
    clearInterval(listTimer);
    listTimer = 0;
  }
  async function refreshList() {
    try {
      sessions = await loadSessions();
      renderSessions(sessions);
    } catch (err) {
      fail("Listing sessions failed")(err);
    }
  }

  function haystack(s) {
    if (!s._hay) s._hay = [s.sessionId, s.name, s.status, s.image, labels(s.metadata)].join(" ").toLowerCase();
    return s._hay;
  }

  // esc makes text safe inside HTML markup (element text and quoted
  // attribute values).
  const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
  const esc = (v) => String(v == null ? "" : v).replace(/[&<>"']/g, (c) => ESC[c]);

  // renderSessions renders list (filtered by the filter box) into the
  // table: one string of markup, every value escaped, parsed at once
  // (what keeps 1,000 rows fast: no call per cell).
  function renderSessions(list, now) {
    now = now || Date.now();
    const q = $("filter").value.trim().toLowerCase();
    const shown = q ? list.filter((s) => haystack(s).includes(q)) : list;
    const html = [];
    const cell = (text, cls) => '<span role="cell"' + (cls ? ' class="' + cls + '"' : "") + ">" + esc(text) + "</span>";
    for (const s of shown) {
      const id = esc(s.sessionId);
      const r = s.resources || {};
      const eg = s.egress || {};
      const lab = labels(s.metadata);
      const st = esc(s.status);
      html.push('<div role="row" class="row"><span role="cell" class="id"><a href="#/s/', esc(encodeURIComponent(s.sessionId)), '">', id, "</a></span>",
        cell(s.name), cell(s.status, "st-" + st), cell(s.image),
        cell(dur(now - Date.parse(s.createdAt)), "num"),
        cell(s.status === "running" ? dur(Date.parse(s.expiresAt) - now) : "", "num"),
        cell(dur(now - Date.parse(s.lastActivityAt)), "num"),
        cell(r.cpus ? String(r.cpus) : "", "num"),
        cell(r.memoryMiB ? r.memoryMiB + " MiB" : "", "num"),
        cell(bytes((eg.bytesIn || 0) + (eg.bytesOut || 0)), "num"),
        '<span role="cell" class="labels"', lab ? ' title="' + esc(lab) + '"' : "", ">", esc(lab), "</span>",
        '<span role="cell">',
        s.status === "running" ? '<button type="button" data-act="stop" data-id="' + id + '" aria-label="Stop ' + id + '">Stop</button> ' : "",
        '<button type="button" data-act="delete" data-id="' + id + '" aria-label="Delete ' + id + '">Delete</button></span></div>');
    }
    const body = makeElement("div");
    body.setAttribute("role", "rowgroup");
    body.className = "rows";
    body.innerHTML = html.join("");
    $("sessions").querySelector(".rows").replaceWith(body);
    const of = listTotal > list.length ? " (the first " + list.length + " of " + listTotal + ")" : "";
    $("count").textContent = (shown.length === list.length ? list.length + " sessions" : shown.length + " of " + list.length + " sessions") + of;
    $("list-more").hidden = listTotal <= list.length;
    return shown.length;
  }

  $("filter").addEventListener("input", () => renderSessions(sessions));
  $("sessions").addEventListener("click", async (e) => {
    const b = e.target.closest("button[data-act]");
    if (!b) return;
    const id = b.dataset.id;
    try {
      if (b.dataset.act === "stop") {
        status("Stopping " + id + "…");
        await api("POST", sid(id) + "/stop");
      } else if (b.dataset.act === "delete") {
        if (!confirmTwice(b)) return;
        status("Deleting " + id + "…");
        await api("DELETE", sid(id));
      }
      status("");
      refreshList();
    } catch (err) {
      status("");
      fail(b.dataset.act + " " + id)(err);
    }
  });

  const splitList = (v) => v.split(",").map((x) => x.trim()).filter(Boolean);
  $("create-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const f = e.target.elements;
    const req = {};
    if (f.image.value.trim()) req.image = f.image.value.trim();
    if (f.name.value.trim()) req.name = f.name.value.trim();
    if (f.ttl.value) req.ttl = Number(f.ttl.value);
    if (f.egress.value.trim()) req.egress = splitList(f.egress.value);
    if (f.secrets.value.trim()) req.secrets = splitList(f.secrets.value);
    const res = {};
    if (f.cpus.value) res.cpus = Number(f.cpus.value);
    if (f.memoryMiB.value) res.memoryMiB = Number(f.memoryMiB.value);
    if (Object.keys(res).length) req.resources = res;
    if (f.labels.value.trim()) {
      req.labels = {};
      for (const kv of splitList(f.labels.value)) {
        const i = kv.indexOf("=");
        req.labels[i < 0 ? kv : kv.slice(0, i).trim()] = i < 0 ? "" : kv.slice(i + 1).trim();
      }
    }
    showError("");
    status("Creating a session…");
    try {
      const s = await api("POST", "v1/sessions", req);
      status("");
      e.target.reset();
      location.hash = "#/s/" + encodeURIComponent(s.sessionId);
    } catch (err) {
      status("");
      fail("Create failed")(err);
    }
  });

  // ---- a session's page ----
  function closePage() {
    const p = page;
    if (!p) return;
    page = null;
    p.closed = true;
    p.ctl.abort();
    for (const t of p.timers) clearInterval(t);
    clearTimeout(p.tlTimer);
    window.removeEventListener("resize", p.onResize);
    if (p.ws) p.ws.close();
    if (p.term) p.term.dispose();
    $("terminal").textContent = "";
    $("timeline").textContent = "";
    $("procs").textContent = "";
    $("proc-out").hidden = true;
    $("record").hidden = true;
    $("tl-older").hidden = true;
  }

  function openSession(id, recordSeq) {
    if (page && page.id === id) {
      showRecord(page, recordSeq);
      return;
    }
    closePage();
    show("session");
    document.title = id + " · sandgate console";
    const p = { id, timers: [], ctl: new AbortController(), maxSeq: 0, followLimit: 1000, entries: [], cap: MAX_LIVE, samples: [], previews: {}, closed: false };
    page = p;
    $("s-id").textContent = id;
    $("s-meta").textContent = "";
    $("session-h").focus();
    openTerminal(p);
    p.loaded = refreshSession(p);
    listFiles(p);
    listProcs(p);
    followTimeline(p);
    pollStats(p);
    showRecord(p, recordSeq);
    const every = (fn, ms) => p.timers.push(setInterval(() => { if (!document.hidden && !p.closed && !p.ended) fn(p); }, ms));
    every(refreshSession, 5000);
    every(pollStats, 2000);
    every(listProcs, 5000);
  }

  async function refreshSession(p) {
    try {
      const s = await api("GET", sid(p.id), undefined, { signal: p.ctl.signal });
      p.session = s;
      const now = Date.now();
      $("s-meta").textContent = [s.status, s.image, s.name ? "name " + s.name : "", "age " + dur(now - Date.parse(s.createdAt)),
        s.status === "running" ? "TTL left " + dur(Date.parse(s.expiresAt) - now) : "", labels(s.metadata)].filter(Boolean).join(" · ");
      $("s-stop").hidden = s.status !== "running";
    } catch (err) {
      if (err.status === 410 || err.status === 404) {
        // Gone: nothing more to follow; say so once.
        p.ended = true;
        $("s-meta").textContent = "ended: " + err.message;
        $("s-stop").hidden = true;
        return;
      }
      fail("Reading the session failed")(err);
    }
  }

  $("s-stop").addEventListener("click", async () => {
    if (!page) return;
    try {
      await api("POST", sid(page.id) + "/stop");
      refreshSession(page);
    } catch (err) { fail("Stop failed")(err); }
  });
  $("s-delete").addEventListener("click", async (e) => {
    if (!page || !confirmTwice(e.currentTarget)) return;
    const id = page.id;
    try {
      await api("DELETE", sid(id));
      location.hash = "#/";
      status("Deleted " + id);
    } catch (err) { fail("Delete failed")(err); }
  });

  // ---- the terminal ----
  function openTerminal(p) {
    const term = new window.Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000,
      fontFamily: "ui-monospace, 'DejaVu Sans Mono', monospace" });
    const fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open($("terminal"));
    p.term = term;
    p.fit = fit;
    // Shift+Tab leaves the terminal, so the keyboard is never trapped in it.
    term.attachCustomKeyEventHandler((ev) => !(ev.key === "Tab" && ev.shiftKey));
    try { fit.fit(); } catch (_) { /* not laid out yet */ }
    term.onData((d) => { if (p.ws && p.ws.readyState === WebSocket.OPEN) p.ws.send(enc.encode(d)); });
    term.onResize(({ cols, rows }) => sendResize(p, cols, rows));
    p.onResize = () => { try { fit.fit(); } catch (_) { /* hidden */ } };
    window.addEventListener("resize", p.onResize);
    const ta = $("terminal").querySelector("textarea");
    if (ta) ta.setAttribute("aria-label", "Terminal input (Shift+Tab leaves the terminal)");
    connect(p);
  }

  function sendResize(p, cols, rows) {
    if (p.ws && p.ws.readyState === WebSocket.OPEN) p.ws.send(JSON.stringify({ type: "resize", cols, rows }));
  }

  async function connect(p) {
    $("term-reconnect").hidden = true;
    $("term-state").textContent = "connecting…";
    let t;
    try {
      t = await api("POST", sid(p.id) + "/tickets", undefined, { signal: p.ctl.signal });
    } catch (err) {
      $("term-state").textContent = "not connected";
      $("term-reconnect").hidden = false;
      fail("Opening the terminal failed")(err);
      return;
    }
    if (p.closed) return;
    const u = new URL(sid(p.id) + "/terminal", ROOT);
    u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    u.searchParams.set("ticket", t.ticket);
    const ws = new WebSocket(u);
    ws.binaryType = "arraybuffer";
    p.ws = ws;
    ws.onopen = () => {
      $("term-state").textContent = "connected";
      sendResize(p, p.term.cols, p.term.rows);
    };
    ws.onmessage = (ev) => {
      if (typeof ev.data !== "string") {
        p.term.write(new Uint8Array(ev.data));
        return;
      }
      const m = JSON.parse(ev.data);
      if (m.type === "exit") p.exit = m.signal ? "signal " + m.signal : "exit " + m.code;
    };
    ws.onclose = (ev) => {
      if (p.closed || p.ws !== ws) return;
      $("term-state").textContent = "closed" + (p.exit ? " (" + p.exit + ")" : ev.reason ? " (" + ev.reason + ")" : "");
      $("term-reconnect").hidden = false;
    };
  }
  $("term-reconnect").addEventListener("click", () => {
    if (!page) return;
    page.exit = "";
    page.term.reset();
    connect(page);
  });

  // ---- files ----
  const joinPath = (dir, name) => (dir === "." || dir === "" ? name : dir.replace(/\/+$/, "") + "/" + name);

  async function listFiles(p) {
    const dir = $("files-path").value.trim() || ".";
    try {
      const l = await api("GET", sid(p.id) + "/files?list=true&path=" + encodeURIComponent(dir), undefined, { signal: p.ctl.signal });
      const body = makeElement("tbody");
      const entries = l.entries.slice().sort((a, b) => (a.type === "dir") === (b.type === "dir") ? a.name.localeCompare(b.name) : a.type === "dir" ? -1 : 1);
      if (dir !== "." && dir !== "/") entries.unshift({ name: "..", path: joinPath(dir, ".."), type: "dir" });
      for (const f of entries) {
        const tr = makeElement("tr");
        const name = makeElement("td");
        if (f.type === "dir") name.append(button(f.name + "/", "cd", f.path, "Open directory " + f.name));
        else name.textContent = f.name;
        tr.append(name, el("td", f.type === "file" ? bytes(f.sizeBytes) : "", "num"), el("td", f.mtime ? new Date(f.mtime).toLocaleString() : ""));
        const acts = makeElement("td");
        if (f.type === "file") acts.append(button("Download", "download", f.path, "Download " + f.name), " ");
        if (f.name !== "..") acts.append(button("Delete", "delete", f.path, "Delete " + f.name));
        tr.append(acts);
        body.append(tr);
      }
      $("files").tBodies[0].replaceWith(body);
      if (l.truncated) status("The listing stopped at 10,000 entries.");
    } catch (err) {
      fail("Listing " + dir + " failed")(err);
    }
  }
  $("files-form").addEventListener("submit", (e) => {
    e.preventDefault();
    if (page) listFiles(page);
  });
  $("files").addEventListener("click", async (e) => {
    const b = e.target.closest("button[data-act]");
    if (!b || !page) return;
    const p = page, path = b.dataset.id;
    try {
      if (b.dataset.act === "cd") {
        $("files-path").value = path;
        return listFiles(p);
      }
      if (b.dataset.act === "download") {
        const res = await api("GET", sid(p.id) + "/files?path=" + encodeURIComponent(path), undefined, { raw: true });
        const blob = await res.blob();
        const a = makeElement("a");
        a.href = URL.createObjectURL(blob);
        a.download = path.split("/").pop();
        document.body.append(a);
        a.click();
        a.remove();
        setTimeout(() => URL.revokeObjectURL(a.href), 60000);
        status("Downloaded " + path + " (" + bytes(blob.size) + ")");
        return;
      }
      if (b.dataset.act === "delete") {
        if (!confirmTwice(b)) return;
        await api("DELETE", sid(p.id) + "/files?path=" + encodeURIComponent(path));
        status("Deleted " + path);
        listFiles(p);
      }
    } catch (err) {
      fail(b.dataset.act + " " + path)(err);
    }
  });

  async function upload(files) {
    const p = page;
    if (!p) return;
    const dir = $("files-path").value.trim() || ".";
    for (const f of files) {
      status("Uploading " + f.name + "…");
      try {
        await api("PUT", sid(p.id) + "/files?path=" + encodeURIComponent(joinPath(dir, f.name)), f);
        status("Uploaded " + f.name + " (" + bytes(f.size) + ")");
      } catch (err) {
        status("");
        fail("Upload of " + f.name + " failed")(err);
      }
    }
    listFiles(p);
  }
  $("upload").addEventListener("change", (e) => {
    upload(Array.from(e.target.files));
    e.target.value = "";
  });
  const drop = $("drop");
  drop.addEventListener("dragover", (e) => {
    e.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer && e.dataTransfer.files.length) upload(Array.from(e.dataTransfer.files));
  });

  // ---- processes ----
  async function listProcs(p) {
    try {
      const l = await api("GET", sid(p.id) + "/processes", undefined, { signal: p.ctl.signal });
      const had = (p.procs || []).length;
      p.procs = l.processes;
      if (l.processes.length !== had && p.entries.length) renderTimeline(p);
      const ul = makeElement("ul");
      ul.id = "procs";
      ul.className = "plain";
      for (const pr of l.processes) {
        const li = makeElement("li");
        const st = pr.status + (pr.exitCode != null ? " " + pr.exitCode : pr.exitSignal ? " " + pr.exitSignal : "");
        li.append(el("code", pr.processId), el("span", pr.command), el("span", st, "muted"),
          button("Output", "follow", pr.processId, "Follow the output of " + pr.processId));
        ul.append(li);
      }
      if (!l.processes.length) ul.append(el("li", "No background processes.", "muted"));
      $("procs").replaceWith(ul);
    } catch (err) {
      fail("Listing processes failed")(err);
    }
  }
  $("proc-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    if (!page) return;
    try {
      const pr = await api("POST", sid(page.id) + "/processes", { command: $("proc-cmd").value });
      $("proc-cmd").value = "";
      await listProcs(page);
      follow(page, pr.processId);
    } catch (err) { fail("Start failed")(err); }
  });
  document.addEventListener("click", (e) => {
    const b = e.target.closest("#procs button[data-act=follow], #timeline button[data-act=follow]");
    if (b && page) follow(page, b.dataset.id);
  });

  // follow streams a process's output (NDJSON, follow=true) into the pane.
  async function follow(p, pid) {
    if (p.follow) p.follow.abort();
    const ctl = new AbortController();
    p.follow = ctl;
    // The page's end ends it; the listener goes when it ends.
    const onClose = () => ctl.abort();
    p.ctl.signal.addEventListener("abort", onClose, { once: true });
    const out = $("proc-out");
    out.hidden = false;
    out.textContent = "";
    out.setAttribute("aria-label", "Output of " + pid);
    try {
      const res = await api("GET", sid(p.id) + "/processes/" + encodeURIComponent(pid) + "/output?follow=true", undefined, { raw: true, signal: ctl.signal });
      const rd = res.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await rd.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          if (!line) continue;
          const m = JSON.parse(line);
          if (m.stdout) out.append(m.stdout);
          if (m.stderr) out.append(el("span", m.stderr, "denied"));
          if (m.stdoutBase64 || m.stderrBase64) out.append("[" + atob(m.stdoutBase64 || m.stderrBase64).length + " binary bytes]");
          if (m.droppedBytes) out.append("[" + m.droppedBytes + " bytes dropped]\n");
          if (m.done) out.append("\n[" + (m.exitSignal ? "signal " + m.exitSignal : "exit " + m.exitCode) + "]\n");
          out.scrollTop = out.scrollHeight;
        }
      }
    } catch (err) {
      fail("Following " + pid + " failed")(err);
    } finally {
      p.ctl.signal.removeEventListener("abort", onClose);
    }
    listProcs(p);
  }

  // ---- the timeline ----
  function kindsShown() {
    return new Set(Array.from(document.querySelectorAll("input[name=kind]:checked")).map((i) => i.value));
  }
  // MAX_LIVE bounds the entries the live follow keeps (the pages loaded
  // with the Older button come on top): past it the oldest go, and the
  // button brings them back.
  const MAX_LIVE = 5000;

  // pollTimeline loads the newest page, then follows: after=maxSeq answers
  // what is newer, in pages when there is more than one (its nextCursor,
  // with the same after=, goes on below); maxSeq moves only once the
  // last of them is in, so a partial answer loses nothing.
  // followTimeline polls the timeline every second while entries come,
  // and less often (up to every TL_IDLE ms) while none do; input on the
  // page, or the page shown again, brings it back to every second. A
  // hidden page does not poll.
  const TL_BUSY = 1000, TL_IDLE = 5000;
  function followTimeline(p) {
    clearTimeout(p.tlTimer);
    if (p.closed) return;
    const gen = p.tlGen = (p.tlGen || 0) + 1; // one chain of polls at a time
    const next = async () => {
      let changed = false;
      if (!document.hidden && !p.ended) changed = await pollTimeline(p);
      if (p.closed || p.tlGen !== gen) return;
      p.tlDelay = changed || !p.tlDelay ? TL_BUSY : Math.min(p.tlDelay * 2, TL_IDLE);
      p.tlTimer = setTimeout(next, p.tlDelay);
    };
    next();
  }
  const wake = () => {
    if (page && !page.closed && page.tlDelay > TL_BUSY) {
      page.tlDelay = 0;
      followTimeline(page);
    }
  };
  for (const ev of ["keydown", "pointerdown", "visibilitychange"]) document.addEventListener(ev, wake, true);

  // pollTimeline reads what is new; true when there was.
  async function pollTimeline(p) {
    if (p.polling) return false;
    p.polling = true;
    try {
      if (!p.maxSeq) {
        const t = await api("GET", sid(p.id) + "/timeline?limit=500", undefined, { signal: p.ctl.signal });
        if (p.closed || !t.entries.length) return false;
        p.maxSeq = t.entries[0].seq;
        p.entries = t.entries;
        setOlder(p, t.nextCursor);
        renderTimeline(p);
        return true;
      }
      const fresh = [];
      let cursor = "";
      for (;;) {
        const t = await api("GET", sid(p.id) + "/timeline?after=" + p.maxSeq + "&limit=" + p.followLimit + (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""),
          undefined, { signal: p.ctl.signal });
        if (p.closed) return false;
        fresh.push(...t.entries);
        cursor = t.nextCursor || "";
        if (!cursor) break;
        if (fresh.length >= MAX_LIVE) {
          // More new entries than the view keeps: they replace it, and
          // the Older button goes on from where this stopped, down
          // through the gap to what was shown.
          p.maxSeq = fresh[0].seq;
          p.entries = fresh;
          p.cap = MAX_LIVE;
          setOlder(p, cursor);
          renderTimeline(p);
          return true;
        }
      }
      if (!fresh.length) return false;
      p.maxSeq = Math.max(p.maxSeq, fresh[0].seq);
      p.entries = fresh.concat(p.entries);
      if (p.entries.length > p.cap) { // the oldest go; the Older button brings them back
        p.entries.length = p.cap;
        setOlder(p, String(p.entries[p.cap - 1].seq));
      }
      renderTimeline(p);
      return true;
    } catch (err) {
      if (err.code !== "audit_unavailable") fail("Reading the timeline failed")(err);
      return false;
    } finally {
      p.polling = false;
    }
  }

  // loadPreview reads the first bytes of a process's output for its
  // timeline entry.
  async function loadPreview(p, pid) {
    p.previews[pid] = "";
    try {
      const res = await api("GET", sid(p.id) + "/processes/" + encodeURIComponent(pid) + "/output", undefined, { raw: true, signal: p.ctl.signal });
      const text = await res.text();
      let out = "";
      for (const line of String(text).split("\n")) {
        if (!line) continue;
        const m = JSON.parse(line);
        out += m.stdout || m.stderr || "";
        if (out.length > 160) break;
      }
      out = out.replace(/\s+/g, " ").trim();
      p.previews[pid] = out.length > 160 ? out.slice(0, 160) + "…" : out;
      if (!p.closed) renderTimeline(p);
    } catch (_) { /* no preview */ }
  }

  // setOlder shows the button that loads the page of entries before the
  // oldest shown, when there is one.
  function setOlder(p, cursor) {
    p.older = cursor || "";
    $("tl-older").hidden = !p.older;
  }
  $("tl-older").addEventListener("click", async () => {
    const p = page;
    if (!p || !p.older) return;
    try {
      const t = await api("GET", sid(p.id) + "/timeline?limit=500&cursor=" + encodeURIComponent(p.older));
      if (p.closed) return;
      p.entries = p.entries.concat(t.entries);
      p.cap = Math.max(p.cap, p.entries.length); // what was asked for stays
      setOlder(p, t.nextCursor);
      renderTimeline(p);
    } catch (err) { fail("Reading older entries failed")(err); }
  });

  function describe(e) {
    switch (e.kind) {
      case "command": {
        const end = e.exitCode != null ? "exit " + e.exitCode : e.signal ? "signal " + e.signal : e.result || "";
        const cmd = e.command || (e.source === "shell" ? "(interactive shell)" : "");
        return [e.source + ": " + cmd, [end, e.timedOut ? "timed out" : "", e.durationMs != null ? e.durationMs + " ms" : "", e.bytes ? bytes(e.bytes) + " out" : ""].filter(Boolean).join(", ")];
      }
      case "egress":
        return [(e.result || "") + " " + (e.host || e.addr || "") + (e.port ? ":" + e.port : ""),
          [e.reason, e.bytesIn || e.bytesOut ? bytes(e.bytesIn) + " in, " + bytes(e.bytesOut) + " out" : ""].filter(Boolean).join(", ")];
      case "file":
        return [e.op + " " + (e.path || "") + (e.target ? " → " + e.target : ""),
          [e.source, e.bytes ? bytes(e.bytes) : "", e.result && e.result !== "ok" ? e.result : ""].filter(Boolean).join(", ")];
      default:
        return [e.op || e.kind, [e.reason, e.by ? "by " + e.by : ""].filter(Boolean).join(", ")];
    }
  }

  const KIND_LABEL = { command: "command", egress: "egress", file: "file", session: "lifecycle" };
  function renderTimeline(p) {
    const kinds = kindsShown();
    const ol = makeElement("ol");
    ol.id = "timeline";
    ol.className = "timeline";
    ol.setAttribute("aria-label", "Timeline, newest first");
    // A file write is recorded when it starts and when it ends: once it
    // has ended, its start is not shown.
    const ended = new Set(p.entries.filter((e) => e.kind === "file" && e.result !== "started" && e.requestId).map((e) => e.requestId + " " + e.op + " " + e.path));
    for (const e of p.entries) {
      if (!kinds.has(e.kind)) continue;
      if (e.kind === "file" && e.result === "started" && ended.has(e.requestId + " " + e.op + " " + e.path)) continue;
      const li = makeElement("li");
      li.dataset.kind = e.kind;
      const t = el("time", new Date(e.time).toLocaleTimeString());
      t.dateTime = e.time;
      const [what, detail] = describe(e);
      const w = el("span", null, "what");
      w.append(el("span", what, e.kind === "egress" && e.result === "denied" ? "denied" : ""));
      if (detail) w.append(" ", el("span", "(" + detail + ")", "muted"));
      // A background process's output is kept: the entry (which names
      // its process) shows its start and can follow it.
      const pr = e.kind === "command" && e.processId && (p.procs || []).find((x) => x.processId === e.processId && x.status !== "running");
      if (pr) {
        const prev = p.previews[pr.processId];
        if (prev === undefined) loadPreview(p, pr.processId);
        else if (prev) w.append(" ", el("q", prev, "preview"));
        w.append(" ", button("output", "follow", pr.processId, "Output of " + pr.processId));
      }
      const a = el("a", "#" + e.seq);
      a.href = "#/s/" + encodeURIComponent(p.id) + "/record/" + e.seq;
      a.setAttribute("aria-label", "Full record " + e.seq);
      w.append(" ", a);
      li.append(t, el("span", KIND_LABEL[e.kind] || e.kind, "k k-" + e.kind), w);
      ol.append(li);
    }
    $("timeline").replaceWith(ol);
  }
  document.querySelectorAll("input[name=kind]").forEach((i) => i.addEventListener("change", () => { if (page) renderTimeline(page); }));

  async function showRecord(p, seq) {
    if (!seq) {
      $("record").hidden = true;
      return;
    }
    $("record").hidden = false;
    $("record-seq").textContent = "#" + seq;
    $("record-body").textContent = "loading…";
    try {
      // The page's id may be the session's name: the audit log knows
      // its id.
      if (!p.session) await p.loaded;
      const id = p.session ? p.session.sessionId : p.id;
      const r = await api("GET", "v1/audit?limit=1&session=" + encodeURIComponent(id) + "&cursor=" + (seq + 1));
      const e = r.events.find((x) => x.seq === seq);
      $("record-body").textContent = e ? JSON.stringify(e, null, 2) : "The audit log no longer holds this record.";
      $("record").scrollIntoView({ block: "nearest" });
    } catch (err) {
      $("record-body").textContent = "";
      fail("Reading record " + seq + " failed")(err);
    }
  }

  // ---- usage charts ----
  async function pollStats(p) {
    let s;
    try {
      s = await api("GET", sid(p.id) + "/stats", undefined, { signal: p.ctl.signal });
    } catch (err) {
      if (err.code !== "session_not_running") fail("Reading stats failed")(err);
      return;
    }
    const t = Date.parse(s.sampledAt);
    const net = (s.tunnel.bytesIn + s.tunnel.bytesOut) + (s.egress.bytesIn + s.egress.bytesOut);
    const prev = p.samples[p.samples.length - 1];
    const sample = { t, cpuSec: s.cpu ? s.cpu.seconds : null, mem: s.memory ? s.memory.currentBytes : null, net, cpu: 0, rate: 0 };
    if (prev && t > prev.t) {
      const dt = (t - prev.t) / 1000;
      sample.cpu = sample.cpuSec != null && prev.cpuSec != null ? Math.max(0, (sample.cpuSec - prev.cpuSec) / dt) : null;
      sample.rate = Math.max(0, (net - prev.net) / dt);
    }
    p.samples.push(sample);
    if (p.samples.length > 900) p.samples.shift();
    const last = p.samples.slice(1);
    chart("chart-cpu", s.cpu ? last.map((x) => x.cpu) : [null], "cap-cpu", "CPU", (v) => v == null ? "not measured" : (v * 100).toFixed(0) + "% of a core");
    chart("chart-mem", p.samples.map((x) => x.mem), "cap-mem", "Memory", (v) => v == null ? "not measured" : bytes(v));
    chart("chart-net", last.map((x) => x.rate), "cap-net", "Network", (v) => v == null ? "" : bytes(Math.round(v)) + "/s");
  }

  function chart(id, values, capId, name, fmt) {
    const c = $(id);
    const ctx = c.getContext("2d");
    ctx.clearRect(0, 0, c.width, c.height);
    const vs = values.filter((v) => v != null);
    const cur = values.length ? values[values.length - 1] : null;
    $(capId).textContent = name + ": " + (values.length ? fmt(cur) : "sampling…");
    if (vs.length < 2) return;
    const max = Math.max(...vs) || 1;
    ctx.strokeStyle = "#0550ae";
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    const n = values.length;
    values.forEach((v, i) => {
      const x = n === 1 ? 0 : (i / (n - 1)) * (c.width - 2) + 1;
      const y = c.height - 2 - ((v || 0) / max) * (c.height - 6);
      if (i) ctx.lineTo(x, y); else ctx.moveTo(x, y);
    });
    ctx.stroke();
  }

  // For the browser test: the list's renderer and the open page.
  window.sandgateConsole = { renderSessions, page: () => page };
  route();
})();
