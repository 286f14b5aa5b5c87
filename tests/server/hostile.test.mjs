// `fp8kv serve` against hostile and edge-case HTTP (issue 37 part C; the
// classes and rules: docs/robustness.md "Server", docs/server.md).
import { test } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import { readFileSync, writeFileSync, cpSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { spawn, execFile } from "node:child_process";
import { startServer, status, miniServer, waitIdle, BIN, MODEL, ASAN } from "./harness.mjs";

const PROMPT = "Once upon a time";
const shared = miniServer();  // shared.srv, shared.client
const post = (url, path, body, headers = {}) =>
  fetch(url + path, { method: "POST", headers: { "content-type": "application/json", ...headers },
                      body: typeof body === "string" ? body : JSON.stringify(body) });

// C5: a finite JSON number beyond FLT_MAX is a 400 naming the field (was a 500).
test("float fields beyond FLT_MAX: 400 with param", async () => {
  for (const field of ["temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p"]) {
    for (const v of ["3.5e38", "1e39", "1e308"]) {
      const r = await post(shared.srv.url, "/v1/completions", `{"prompt": "a", "max_tokens": 1, "${field}": ${v}}`);
      assert.equal(r.status, 400, `${field} ${v}`);
      const e = (await r.json()).error;
      assert.equal(e.param, field);
      assert.equal(e.type, "invalid_request_error");
    }
  }
});

// C7: text parts (OpenAI, vLLM) render as the joined string; other parts are refused by name.
test("chat content as an array of text parts; non-text parts refused by name", async () => {
  const plain = await shared.client.chat.completions.create({ model: "mini", max_tokens: 6, temperature: 0,
                                                       messages: [{ role: "user", content: "Tell me\na story." }] });
  const parts = await shared.client.chat.completions.create({ model: "mini", max_tokens: 6, temperature: 0,
    messages: [{ role: "user", content: [{ type: "text", text: "Tell me" }, { type: "text", text: "a story." }] }] });
  assert.equal(parts.choices[0].message.content, plain.choices[0].message.content);
  assert.equal(parts.usage.prompt_tokens, plain.usage.prompt_tokens);
  const e = await status(shared.client.chat.completions.create({ model: "mini", max_tokens: 2,
    messages: [{ role: "user", content: [{ type: "text", text: "hi" }, { type: "image_url", image_url: { url: "http://x/y.png" } }] }] }));
  assert.equal(e.status, 400);
  assert.equal(e.param, "messages[0].content[1]");
  assert.match(e.message, /"image_url"/);
  // /tokenize renders messages the same way.
  const t = await (await post(shared.srv.url, "/tokenize", { messages: [{ role: "user", content: [{ type: "text", text: "hi" }] }] })).json();
  const u = await (await post(shared.srv.url, "/tokenize", { messages: [{ role: "user", content: "hi" }] })).json();
  assert.deepEqual(t.tokens, u.tokens);
});

// C7: shared.client.models.retrieve.
test("GET /v1/models/{id}", async () => {
  const m = await shared.client.models.retrieve("mini");
  assert.equal(m.id, "mini");
  assert.equal(m.object, "model");
  const e = await status(shared.client.models.retrieve("gpt-4"));
  assert.equal(e.status, 404);
  assert.equal(e.code, "model_not_found");
});

// C9: `code` is OpenAI's string code where it has one, else the HTTP status (docs/server.md "Errors").
test("error codes as documented", async () => {
  const nf = (await (await post(shared.srv.url, "/v1/completions", { model: "x", prompt: "a" })).json()).error;
  assert.equal(nf.code, "model_not_found");
  const bad = (await (await post(shared.srv.url, "/v1/completions", { prompt: "a", n: 2 })).json()).error;
  assert.equal(bad.code, 400);
});

// C10: at most max_num_seqs + max_waiting requests in flight; the rest get 503 at once.
test("admission: --max-num-seqs 2 --max-waiting 2 admits exactly 4 of 10", async () => {
  const s = await startServer(["--max-num-seqs", "2", "--max-waiting", "2"]);
  try {
    const rs = await Promise.all(Array.from({ length: 10 }, () =>
      post(s.url, "/v1/completions", { prompt: PROMPT, max_tokens: 300, ignore_eos: true, temperature: 0 })));
    const codes = rs.map((r) => r.status).sort();
    assert.deepEqual(codes, [200, 200, 200, 200, 503, 503, 503, 503, 503, 503]);
  } finally {
    await s.stop();
  }
});

// C2: a second server on a busy port exits 2 with a clear message (httplib's
// default SO_REUSEPORT let it start and take half the connections).
test("a second server on the same port exits 2", async () => {
  const port = new URL(shared.srv.url).port;
  const p = spawn(BIN, ["serve", MODEL, "--port", port, "--threads", "1"], { stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  p.stderr.on("data", (d) => { err += d; });
  const code = await new Promise((resolve) => p.on("exit", (c) => resolve(c)));
  assert.equal(code, 2, err);
  assert.match(err, new RegExp(`--port ${port}: cannot bind: the port is already in use`));
  for (let i = 0; i < 20; i++) assert.equal((await fetch(shared.srv.url + "/health")).status, 200);
});

// C8: JSON bodies must say so (a cross-site "simple" request cannot); CORS is
// off by default; preflights need no key.
test("415 unless application/json; CORS off by default; preflight without the key", async () => {
  const body = JSON.stringify({ prompt: "a", max_tokens: 1 });
  for (const ct of ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", null]) {
    const headers = ct ? { "content-type": ct } : {};
    const r = await fetch(shared.srv.url + "/v1/completions", { method: "POST", headers, body: ct ? body : new Uint8Array(Buffer.from(body)) });
    assert.equal(r.status, 415, String(ct));
    assert.match((await r.json()).error.message, /application\/json/);
  }
  const ok = await post(shared.srv.url, "/v1/completions", body, { "content-type": "Application/JSON; charset=utf-8" });
  assert.equal(ok.status, 200);
  // CORS off: no Access-Control-Allow-Origin, on a request or a preflight.
  const pre = await fetch(shared.srv.url + "/v1/completions", { method: "OPTIONS", headers: {
    origin: "http://evil.example", "access-control-request-method": "POST", "access-control-request-headers": "content-type" } });
  assert.equal(pre.status, 204);
  assert.equal(pre.headers.get("access-control-allow-origin"), null);
  const x = await post(shared.srv.url, "/v1/completions", body, { origin: "http://evil.example" });
  assert.equal(x.headers.get("access-control-allow-origin"), null);

  const s = await startServer(["--api-key", "k", "--allowed-origins", '["http://app.example"]',
                               "--allowed-methods", '["GET", "POST"]']);
  try {
    const pf = await fetch(s.url + "/v1/chat/completions", { method: "OPTIONS", headers: {
      origin: "http://app.example", "access-control-request-method": "POST",
      "access-control-request-headers": "authorization, content-type" } });
    assert.equal(pf.status, 204);  // no key needed
    assert.equal(pf.headers.get("access-control-allow-origin"), "http://app.example");
    assert.equal(pf.headers.get("access-control-allow-methods"), "GET, POST");
    assert.equal(pf.headers.get("access-control-allow-headers"), "authorization, content-type");
    const other = await fetch(s.url + "/v1/models", { method: "OPTIONS", headers: { origin: "http://evil.example" } });
    assert.equal(other.headers.get("access-control-allow-origin"), null);
    const r = await fetch(s.url + "/v1/models", { headers: { origin: "http://app.example", authorization: "Bearer k" } });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get("access-control-allow-origin"), "http://app.example");
    assert.equal((await fetch(s.url + "/v1/models", { headers: { origin: "http://app.example" } })).status, 401);
  } finally {
    await s.stop();
  }
});

test("--allowed-origins must be a JSON array: exit 2", async () => {
  const r = await new Promise((resolve) => execFile(BIN, ["serve", MODEL, "--port", "0", "--allowed-origins", "http://a"],
                                                    (e, out, err) => resolve({ code: e ? e.code : 0, err })));
  assert.equal(r.code, 2);
  assert.match(r.err, /--allowed-origins: expected a JSON array of strings/);
});

// Raw HTTP over one TCP connection: writes `data`, returns what came back
// until the server closed or `ms` passed, and when the first byte came.
function exchange(url, data, ms = 2000) {
  const u = new URL(url);
  return new Promise((resolve) => {
    const t0 = Date.now();
    let text = "", first = null;
    const sock = net.connect(Number(u.port), u.hostname, () => sock.write(data));
    const done = (closed) => { clearTimeout(timer); sock.destroy(); resolve({ text, closed, firstMs: first }); };
    const timer = setTimeout(() => done(false), ms);
    sock.on("data", (d) => { if (first === null) first = Date.now() - t0; text += d.toString(); });
    sock.on("end", () => done(true));
    sock.on("error", () => done(true));
  });
}

// C6: ambiguous framing is answered 400 at once (the first Content-Length was
// used; -5 got a 413 after 5 s); pipelined requests are answered in order.
test("HTTP framing: conflicting or negative Content-Length, TE with CL: 400 at once", async () => {
  const head = "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  for (const h of ["Content-Length: 5\r\nContent-Length: 7\r\n", "Content-Length: -5\r\n", "Content-Length: 5, 6\r\n",
                   "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n", "Content-Length: 1e3\r\n"]) {
    const r = await exchange(shared.srv.url, head + h + "\r\n", 3000);
    assert.match(r.text, /^HTTP\/1\.1 400 /, h);
    assert.ok(r.firstMs < 1000, `${h}: answered after ${r.firstMs} ms`);
    assert.ok(r.closed, h);
    assert.match(r.text, /"invalid_request_error"/);
  }
  const big = await exchange(shared.srv.url, head + `Content-Length: ${64 << 20}\r\n\r\n`, 3000);
  assert.match(big.text, /^HTTP\/1\.1 413 /);
  assert.ok(big.firstMs < 1000);
});

test("pipelined requests in one write are answered in order", async () => {
  const body = JSON.stringify({ prompt: "hello" });
  const r = await exchange(shared.srv.url,
    "GET /version HTTP/1.1\r\nHost: x\r\n\r\n" +
    `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}` +
    "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 5000);
  assert.equal(r.text.match(/HTTP\/1\.1 200 OK/g)?.length, 3, r.text);
  const a = r.text.indexOf('"version"'), b = r.text.indexOf('"tokens"'), c = r.text.indexOf('"object":"list"');
  assert.ok(a > 0 && a < b && b < c, r.text);
  assert.ok(r.closed);
  // A chunked request body.
  const chunked = await exchange(shared.srv.url, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
    "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
    `${(10).toString(16)}\r\n${body.slice(0, 10)}\r\n${(body.length - 10).toString(16)}\r\n${body.slice(10)}\r\n0\r\n\r\n`, 5000);
  assert.match(chunked.text, /^HTTP\/1\.1 200 /);
  assert.match(chunked.text, /"tokens"/);
});

// C3: the grace bounds everything, slow clients included.
test("SIGTERM with clients dripping headers or a body: exit within the grace", async () => {
  const s = await startServer(["--shutdown-grace", "1"]);
  const u = new URL(s.url);
  const socks = [];
  const drip = (first, line) => {
    const sock = net.connect(Number(u.port), u.hostname, () => sock.write(first));
    sock.on("error", () => {});
    const t = setInterval(() => { if (!sock.destroyed) sock.write(line); }, 200);
    socks.push([sock, t]);
  };
  try {
    drip("GET /health HTTP/1.1\r\n", "X-Drip: 1\r\n");
    drip("POST /tokenize HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n", "{");
    await new Promise((r) => setTimeout(r, 600));
    const t0 = Date.now();
    const killer = setTimeout(() => s.proc.kill("SIGKILL"), 15000);
    await s.stop();  // asserts exit 0
    clearTimeout(killer);
    const took = (Date.now() - t0) / 1000;
    assert.ok(took < 1 + 2 + 1, `exit took ${took} s with grace 1 s`);
  } finally {
    for (const [sock, t] of socks) { clearInterval(t); sock.destroy(); }
  }
});

// C4: slow connections cost no worker; a client keeps getting answers.
test("2,000 connections dripping headers: other clients are still answered", async () => {
  const u = new URL(shared.srv.url);
  const N = 2000;
  const socks = [];
  await Promise.all(Array.from({ length: N }, () => new Promise((resolve) => {
    const sock = net.connect(Number(u.port), u.hostname, () => { sock.write("GET /health HTTP/1.1\r\n"); resolve(); });
    sock.on("error", () => resolve());
    socks.push(sock);
  })));
  const drip = setInterval(() => { for (const s of socks) if (!s.destroyed) s.write("X-Drip: 1\r\n"); }, 2000);
  try {
    const t0 = Date.now();
    let answered = 0, worst = 0;
    while (Date.now() - t0 < 5000) {
      const a = Date.now();
      const h = await fetch(shared.srv.url + "/health", { signal: AbortSignal.timeout(5000) });
      assert.equal(h.status, 200);
      const r = await shared.client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 2 }, { timeout: 5000 });
      assert.equal(r.choices.length, 1);
      worst = Math.max(worst, Date.now() - a);
      answered++;
    }
    assert.ok(answered >= 5, `answered ${answered}`);
    assert.ok(worst < 3000, `worst probe ${worst} ms`);
    const open = socks.filter((s) => !s.destroyed && s.readyState === "open").length;
    assert.ok(open >= N * 0.95, `only ${open} of ${N} slow connections stayed open`);
  } finally {
    clearInterval(drip);
    for (const s of socks) s.destroy();
  }
});

test("--max-connections: the connection over the cap gets a 503", async () => {
  const s = await startServer(["--max-connections", "20"]);
  const u = new URL(s.url);
  const socks = [];
  try {
    for (let i = 0; i < 20; i++) {
      await new Promise((resolve) => {
        const sock = net.connect(Number(u.port), u.hostname, () => { sock.write("GET /health HTTP/1.1\r\n"); resolve(); });
        socks.push(sock);
      });
    }
    await new Promise((r) => setTimeout(r, 300));
    const r = await exchange(s.url, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 3000);
    assert.match(r.text, /^HTTP\/1\.1 503 /);
    assert.match(r.text, /too many open connections/);
    for (const k of socks) k.destroy();
    await new Promise((r) => setTimeout(r, 300));
    assert.equal((await fetch(s.url + "/health")).status, 200);
  } finally {
    for (const k of socks) k.destroy();
    await s.stop();
  }
});

// C1: a prompt too long to fit is refused by its bytes before tokenizing,
// and large requests leave no memory behind (a 4 MiB prompt left 16 MB).
test("20 large refused prompts leave RSS within 50 MB; tokenize scratch is released",
     { skip: ASAN && "ASan build: freed memory stays in its quarantine" }, async () => {
  const rssKiB = () => Number(readFileSync(`/proc/${shared.srv.proc.pid}/status`, "utf8").match(/^VmRSS:\s+(\d+)/m)[1]);
  const big = "the cat sat on a mat. ".repeat((4 << 20) / 22);
  const before = rssKiB();
  for (let i = 0; i < 20; i++) {
    const a = Date.now();
    const r = await post(shared.srv.url, "/v1/completions", { prompt: big + i, max_tokens: 1 });
    assert.equal(r.status, 400);
    const e = (await r.json()).error;
    assert.equal(e.param, "prompt");
    assert.match(e.message, /refused before tokenizing/);
    assert.ok(Date.now() - a < 5000, `refusal took ${Date.now() - a} ms`);
  }
  const chat = await post(shared.srv.url, "/v1/chat/completions", { messages: [{ role: "user", content: big }], max_tokens: 1 });
  assert.equal(chat.status, 400);
  assert.equal((await chat.json()).error.param, "messages");
  // /tokenize has no length bound: a 1 MiB text is tokenized in full.
  const mid = big.slice(0, 1 << 20);
  for (let i = 0; i < 3; i++) assert.equal((await post(shared.srv.url, "/tokenize", { prompt: mid })).status, 200);
  const after = rssKiB();
  console.log(JSON.stringify({ rss_before_kib: before, rss_after_kib: after }));
  assert.ok(after - before < 50 * 1024, `RSS ${before} KiB before, ${after} KiB after`);
});

// B (silent acceptance): a v_scale of 1e-6 clips nearly all of V; the store
// counts it (docs/robustness.md "KV clipping"). /metrics has
// fp8kv:kv_cache_clipped_total per layer and stream, the engine warns once
// per layer, and the count is bounded by what was stored.
test("kv_cache_clipped_total{layer,stream}: labels on every layer; a tiny v_scale clips V", async () => {
  const cfg = JSON.parse(readFileSync(MODEL + "/config.json", "utf8"));
  const L = cfg.num_hidden_layers, elems = cfg.num_key_value_heads * cfg.head_dim;
  const clipped = (text, layer, stream) => {
    const m = text.match(new RegExp(`^fp8kv:kv_cache_clipped_total\\{model_name="[^"]*",layer="${layer}",stream="${stream}"\\} (\\d+)$`, "m"));
    return m ? Number(m[1]) : undefined;
  };
  // The shared server: every layer and stream has its line (counted on the CPU).
  const base = (await waitIdle(shared.srv.url)).text;
  assert.match(base, /^# TYPE fp8kv:kv_cache_clipped_total counter$/m);
  for (let l = 0; l < L; l++) for (const s of ["k", "v"]) assert.notEqual(clipped(base, l, s), undefined, `layer ${l} ${s}`);
  assert.equal(clipped(base, L, "k"), undefined);

  // A copy of the model whose v_scale tensors are 1e-6.
  const dir = mkdtempSync(join(tmpdir(), "fp8kv-clip-"));
  try {
    cpSync(MODEL, dir, { recursive: true, filter: (src) => !src.endsWith(".xz") });
    const f = join(dir, "kv_cache_scales.safetensors");
    const b = readFileSync(f);
    const n = Number(b.readBigUInt64LE(0));
    const header = JSON.parse(b.subarray(8, 8 + n).toString("utf8"));
    let edited = 0;
    for (const [name, t] of Object.entries(header)) {
      if (!name.endsWith(".v_scale")) continue;
      assert.equal(t.dtype, "F32");
      b.writeFloatLE(1e-6, 8 + n + t.data_offsets[0]);
      edited++;
    }
    assert.equal(edited, L);
    writeFileSync(f, b);
    const srv = await startServer(["--served-model-name", "clipped", "--kv-cache-dtype", "fp8_e4m3"], dir);
    try {
      const zero = await (await fetch(srv.url + "/metrics")).text();
      for (let l = 0; l < L; l++) assert.equal(clipped(zero, l, "v"), 0, `layer ${l} before any request`);
      const r = await post(srv.url, "/v1/completions", { model: "clipped", prompt: PROMPT, max_tokens: 4, temperature: 0, ignore_eos: true });
      assert.equal(r.status, 200);
      const u = (await r.json()).usage;
      // Every token but the last generated one went through the store.
      const stored = (u.prompt_tokens + u.completion_tokens - 1) * elems;
      const text = (await waitIdle(srv.url)).text;  // the gauges are copied when the engine is idle
      for (let l = 0; l < L; l++) {
        const v = clipped(text, l, "v"), k = clipped(text, l, "k");
        // |v| > 448e-6 for all but the values nearest 0.
        assert.ok(v > 0.9 * stored && v <= stored, `layer ${l}: ${v} of ${stored} V values clipped`);
        assert.ok(k >= 0 && k <= stored, `layer ${l}: k ${k}`);
        assert.match(srv.log(), new RegExp(`layer ${l}: \\d+ of \\d+ V values stored so far \\([0-9.]+%\\) clipped`));
      }
      // One warning per layer and stream, not one per step.
      const r2 = await post(srv.url, "/v1/completions", { model: "clipped", prompt: PROMPT, max_tokens: 4, temperature: 0 });
      assert.equal(r2.status, 200);
      assert.equal(srv.log().match(/layer 0: \d+ of \d+ V values stored so far/g).length, 1);
    } finally {
      await srv.stop();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
