// `fp8kv serve` through the official openai npm client (docs/server.md).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { existsSync } from "node:fs";
import { startServer, status, metrics, waitIdle, generateCli, capacity, MODEL } from "./harness.mjs";

const PROMPT = "Once upon a time";
let srv, client;

before(async () => {
  srv = await startServer(["--served-model-name", "mini"]);
  client = new OpenAI({ baseURL: srv.url + "/v1", apiKey: "unused", maxRetries: 0 });
});
after(async () => { if (srv) await srv.stop(); });

async function raw(path, body, headers = {}) {
  return fetch(srv.url + path, { method: "POST", headers: { "content-type": "application/json", ...headers }, body });
}

test("models, health, version", async () => {
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ["mini"]);
  assert.equal((await fetch(srv.url + "/health")).status, 200);
  const v = await (await fetch(srv.url + "/version")).json();
  assert.match(v.version, /^\d+\.\d+\.\d+/);
});

test("greedy completion equals fp8kv generate", async () => {
  const expected = await generateCli(PROMPT, 16);
  const r = await client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 16, temperature: 0 });
  assert.equal(r.choices[0].text, expected);
  assert.equal(r.choices[0].finish_reason, "length");
  const tok = await (await raw("/tokenize", JSON.stringify({ prompt: PROMPT }))).json();
  assert.deepEqual(r.usage, { prompt_tokens: tok.count, completion_tokens: 16, total_tokens: tok.count + 16 });
  // The same prompt as token ids gives the same text.
  const ids = await client.completions.create({ model: "mini", prompt: tok.tokens, max_tokens: 16, temperature: 0 });
  assert.equal(ids.choices[0].text, expected);
});

test("streaming: same text, finish reason, usage chunk, [DONE]", async () => {
  const whole = await client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 12, temperature: 0 });
  const stream = await client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 12, temperature: 0,
                                                   stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null, chunks = 0;
  for await (const c of stream) {
    chunks++;
    if (c.choices.length) { text += c.choices[0].text; finish = c.choices[0].finish_reason ?? finish; }
    if (c.usage) usage = c.usage;
  }
  assert.ok(chunks > 2);
  assert.equal(text, whole.choices[0].text);
  assert.equal(finish, "length");
  assert.deepEqual(usage, whole.usage);
  const body = await (await raw("/v1/completions", JSON.stringify({ prompt: PROMPT, max_tokens: 2, stream: true }))).text();
  assert.ok(body.trimEnd().endsWith("data: [DONE]"), body);
});

test("streaming with continuous_usage_stats: every chunk counts the tokens so far (vLLM)", async () => {
  const stream = await client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 8, temperature: 0,
                                                   stream: true,
                                                   stream_options: { include_usage: true, continuous_usage_stats: true } });
  const seen = [];
  let last = null;
  for await (const c of stream) {
    assert.ok(c.usage, "a chunk without usage");
    if (c.choices.length) seen.push(c.usage.completion_tokens);
    else last = c.usage;
  }
  // Increasing (each chunk at least one token further), ending at all 8.
  for (let i = 1; i < seen.length; i++) assert.ok(seen[i] > seen[i - 1], String(seen));
  assert.equal(seen.at(-1), 8);
  assert.equal(last.completion_tokens, 8);
  assert.equal(last.total_tokens, last.prompt_tokens + 8);
});

test("logprobs (completions shape)", async () => {
  const r = await client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 8, temperature: 0, logprobs: 3 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 8);
  assert.equal(lp.tokens.join(""), r.choices[0].text);
  for (let i = 0; i < 8; i++) {
    assert.ok(lp.token_logprobs[i] <= 0);
    const top = lp.top_logprobs[i];
    assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 4);
    // Greedy: the chosen token is the most likely one.
    assert.equal(lp.token_logprobs[i], Math.max(...Object.values(top)));
    assert.equal(top[lp.tokens[i]], lp.token_logprobs[i]);
  }
  assert.deepEqual(lp.text_offset.slice(0, 2), [0, lp.tokens[0].length]);
});

test("stop strings across token boundaries are not emitted, streamed or not", async () => {
  const base = await client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 24, temperature: 0, logprobs: 0 });
  const toks = base.choices[0].logprobs.tokens;
  // The end of one token and the start of the next.
  let j = 3;
  while (j < toks.length - 1 && (toks[j].length < 2 || toks[j + 1].length < 2)) j++;
  const stop = toks[j].slice(-2) + toks[j + 1].slice(0, 2);
  const full = base.choices[0].text;
  const expected = full.slice(0, full.indexOf(stop));
  const r = await client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 24, temperature: 0, stop: [stop, "zzzz"] });
  assert.equal(r.choices[0].text, expected);
  assert.equal(r.choices[0].finish_reason, "stop");
  assert.equal(r.choices[0].stop_reason, stop);
  const s = await client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 24, temperature: 0, stop, stream: true });
  let text = "", finish;
  for await (const c of s) { text += c.choices[0].text; finish = c.choices[0].finish_reason ?? finish; }
  assert.equal(text, expected);
  assert.equal(finish, "stop");
});

test("stop_token_ids", async () => {
  const base = await client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 8, temperature: 0, logprobs: 0 });
  const t = base.choices[0].logprobs.tokens[3];
  const id = (await (await raw("/tokenize", JSON.stringify({ prompt: t, add_special_tokens: false }))).json()).tokens[0];
  const r = await client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 8, temperature: 0, stop_token_ids: [id] });
  assert.equal(r.choices[0].finish_reason, "stop");
  assert.equal(r.choices[0].stop_reason, id);
  assert.ok(base.choices[0].text.startsWith(r.choices[0].text));
  assert.ok(r.usage.completion_tokens <= 4);
});

test("the same seed gives the same text", async () => {
  const run = (seed) => client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 16, temperature: 1, seed })
    .then((r) => r.choices[0].text);
  const [a, b, c] = await Promise.all([run(42), run(42), run(43)]);
  assert.equal(a, b);
  assert.notEqual(a, c);
});

test("errors: 400 naming the field, 404, 413", async () => {
  const cases = [
    [{ prompt: PROMPT, temperature: -1 }, "temperature"],
    [{ prompt: PROMPT, top_p: 0 }, "top_p"],
    [{ prompt: PROMPT, n: 2 }, "n"],
    [{ prompt: PROMPT, logprobs: 21 }, "logprobs"],
    [{ prompt: PROMPT, presence_penalty: 0.5 }, "presence_penalty"],
    [{ prompt: PROMPT, frobnicate: true }, "frobnicate"],
    [{ prompt: [1, 2, 999999] }, "prompt"],
    [{ prompt: PROMPT, max_tokens: 5000 }, "max_tokens"],
  ];
  for (const [body, field] of cases) {
    const e = await status(client.completions.create({ model: "mini", ...body }));
    assert.equal(e.status, 400, JSON.stringify(body));
    assert.equal(e.param, field);
    assert.equal(e.type, "invalid_request_error");
  }
  const long = await status(client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 5000 }));
  assert.match(long.message, /5004 tokens .* 908 over/);
  // No-op values are accepted.
  const ok = await client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 1, n: 1, presence_penalty: 0,
                                               frequency_penalty: 0, logit_bias: {}, user: "u1" });
  assert.equal(ok.choices.length, 1);
  const bad = await raw("/v1/completions", "{not json");
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.type, "invalid_request_error");
  assert.equal((await status(client.completions.create({ model: "other", prompt: PROMPT }))).status, 404);
  const nf = await fetch(srv.url + "/v1/nothing");
  assert.equal(nf.status, 404);
  assert.ok((await nf.json()).error.message);
  const big = await raw("/v1/completions", JSON.stringify({ prompt: "x".repeat(33 << 20) }));
  assert.equal(big.status, 413);
  assert.ok((await big.json()).error);
});

// Chat needs a template: the bundled model ships one once src/template/ is in the build.
const HAS_CHAT_TEMPLATE = existsSync(MODEL + "/chat_template.jinja");
const MESSAGES = [{ role: "system", content: "You are terse." }, { role: "user", content: "Tell me a story." }];

test("chat: greedy equals completions on the rendered prompt, streamed and not, logprobs", { skip: !HAS_CHAT_TEMPLATE }, async () => {
  const tok = await (await raw("/tokenize", JSON.stringify({ messages: MESSAGES }))).json();
  assert.ok(tok.count > 0, JSON.stringify(tok));
  const comp = await client.completions.create({ model: "mini", prompt: tok.tokens, max_tokens: 12, temperature: 0 });
  const chat = await client.chat.completions.create({ model: "mini", messages: MESSAGES, max_tokens: 12, temperature: 0,
                                                      logprobs: true, top_logprobs: 2 });
  assert.equal(chat.object, "chat.completion");
  assert.equal(chat.choices[0].message.role, "assistant");
  assert.equal(chat.choices[0].message.content, comp.choices[0].text);
  assert.equal(chat.usage.prompt_tokens, tok.count);
  const lp = chat.choices[0].logprobs.content;
  assert.equal(lp.length, chat.usage.completion_tokens);
  for (const e of lp) {
    assert.ok(e.logprob <= 0 && e.top_logprobs.length === 2);
    assert.equal(e.top_logprobs[0].logprob, e.logprob);  // greedy: the top one
    assert.deepEqual(e.bytes, [...Buffer.from(e.token)]);
  }
  const stream = await client.chat.completions.create({ model: "mini", messages: MESSAGES, max_tokens: 12, temperature: 0,
                                                        stream: true, stream_options: { include_usage: true } });
  let text = "", role = null, finish = null, usage = null;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    if (!c.choices.length) continue;
    role = c.choices[0].delta.role ?? role;
    text += c.choices[0].delta.content ?? "";
    finish = c.choices[0].finish_reason ?? finish;
  }
  assert.equal(role, "assistant");
  assert.equal(text, chat.choices[0].message.content);
  assert.equal(finish, chat.choices[0].finish_reason);
  assert.deepEqual(usage, chat.usage);
  const e = await status(client.chat.completions.create({ model: "mini", messages: MESSAGES, top_logprobs: 2 }));
  assert.equal(e.status, 400);
  assert.equal(e.param, "top_logprobs");
});

test("chat without a template is a clear 400", { skip: HAS_CHAT_TEMPLATE }, async () => {
  const e = await status(client.chat.completions.create({ model: "mini", messages: [{ role: "user", content: "hi" }] }));
  assert.equal(e.status, 400);
  assert.match(e.message, /no chat template/);
});

test("tokenize / detokenize round trip", async () => {
  const t = await (await raw("/tokenize", JSON.stringify({ prompt: "hello world", return_token_strs: true }))).json();
  assert.equal(t.count, t.tokens.length);
  assert.equal(t.token_strs.length, t.count);
  const d = await (await raw("/detokenize", JSON.stringify({ tokens: t.tokens }))).json();
  assert.equal(d.prompt, "hello world");
});

test("a client that disconnects mid-stream cancels its request", async () => {
  const ac = new AbortController();
  const s = await client.completions.create({ model: "mini", prompt: PROMPT, max_tokens: 3000, temperature: 0, stream: true },
                                            { signal: ac.signal });
  let n = 0;
  try {
    for await (const c of s) { void c; if (++n === 3) ac.abort(); }
  } catch (e) { assert.equal(e.name, "APIUserAbortError"); }
  const t0 = Date.now();
  const m = await waitIdle(srv.url, 10000);
  assert.ok(Date.now() - t0 < 10000);
  assert.ok(m.get("fp8kv:generation_tokens_total") < 2000, "the request kept running");
});

// Non-streaming: nothing is written until the end, so the server checks the
// connection while it waits (src/server/peer_socket.h); a client that goes
// away cancels the request, and the pool is whole again within a few polls.
test("a non-streaming client that disconnects cancels its request", async () => {
  const before = (await waitIdle(srv.url)).get("fp8kv:generation_tokens_total");
  const ac = new AbortController();
  const body = JSON.stringify({ model: "mini", prompt: PROMPT, max_tokens: 3000, temperature: 0, ignore_eos: true });
  const pending = fetch(srv.url + "/v1/completions",
                        { method: "POST", headers: { "content-type": "application/json" }, body, signal: ac.signal });
  await new Promise((r) => setTimeout(r, 1500));
  ac.abort();
  await assert.rejects(pending, (e) => e.name === "AbortError");
  const t0 = Date.now();
  const m = await waitIdle(srv.url, 10000);
  assert.ok(Date.now() - t0 < 10000);
  assert.ok(m.get("fp8kv:generation_tokens_total") - before < 2000, "the request kept running");
});

test("metrics", async () => {
  const m = await waitIdle(srv.url);
  for (const name of ["fp8kv:num_requests_running", "fp8kv:num_requests_waiting", "fp8kv:kv_cache_usage_perc",
                      "fp8kv:prompt_tokens_total", "fp8kv:generation_tokens_total", "fp8kv:num_preemptions_total",
                      "fp8kv:prefix_cache_queries_total", "fp8kv:prefix_cache_hits_total"])
    assert.notEqual(m.get(name), undefined, name);
  assert.ok(m.get("fp8kv:generation_tokens_total") > 50);
  for (const h of ["fp8kv:time_to_first_token_seconds", "fp8kv:inter_token_latency_seconds", "fp8kv:e2e_request_latency_seconds"])
    assert.ok(m.get(h + "_count") > 0, h);
  assert.equal(m.get("fp8kv:kv_cache_usage_perc"), 0);
});

// Prefix caching (on by default, docs/server.md): a second prompt sharing a
// long prefix reuses its full blocks: the hit count is exactly the shared
// whole blocks (16 tokens each; at least the last prompt token is computed),
// and the greedy text equals a server started with --no-enable-prefix-caching.
test("prefix cache: hits counted, same greedy text as with caching off", async () => {
  const long = "The quick brown fox jumps over the lazy dog, and then it runs away into the forest. ".repeat(6);
  const prompts = [long + "Once", long + "Later that day"];
  const ids = [];
  for (const p of prompts) ids.push((await (await raw("/tokenize", JSON.stringify({ prompt: p }))).json()).tokens);
  let common = 0;
  while (common < ids[0].length && common < ids[1].length && ids[0][common] === ids[1][common]) common++;
  const expectHit = Math.floor(Math.min(common, ids[1].length - 1) / 16) * 16;
  assert.ok(expectHit >= 64, `shared prefix too short: ${common} tokens`);
  const texts = [];
  const m0 = await waitIdle(srv.url);
  texts.push((await client.completions.create({ model: "mini", prompt: prompts[0], max_tokens: 8, temperature: 0 })).choices[0].text);
  const m1 = await waitIdle(srv.url);
  texts.push((await client.completions.create({ model: "mini", prompt: prompts[1], max_tokens: 8, temperature: 0 })).choices[0].text);
  const m2 = await waitIdle(srv.url);
  const Q = "fp8kv:prefix_cache_queries_total", H = "fp8kv:prefix_cache_hits_total";
  assert.equal(m1.get(Q) - m0.get(Q), ids[0].length);
  assert.equal(m2.get(Q) - m1.get(Q), ids[1].length);
  assert.equal(m2.get(H) - m1.get(H), expectHit);
  const off = await startServer(["--served-model-name", "mini", "--no-enable-prefix-caching"]);
  try {
    const c = new OpenAI({ baseURL: off.url + "/v1", apiKey: "unused", maxRetries: 0 });
    for (let i = 0; i < prompts.length; i++) {
      const r = await c.completions.create({ model: "mini", prompt: prompts[i], max_tokens: 8, temperature: 0 });
      assert.equal(r.choices[0].text, texts[i], `prompt ${i}`);
    }
    const m = await waitIdle(off.url);
    assert.equal(m.get(H), 0);
    assert.equal(m.get(Q), 0);
  } finally {
    await off.stop();
  }
});

// A pool of one 128-token request and 6 concurrent requests that grow past
// it: the scheduler preempts (recompute), /metrics counts it, every request
// still finishes with its full length, and the pool is whole again. Half of
// them stream: a preempted stream never sends a token twice, so every text
// (streamed or not) equals the greedy text of the unpreempted server.
async function streamText(c, body) {
  const s = await c.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  let text = "", finish = null, usage = null;
  for await (const ch of s) {
    if (ch.choices.length) { text += ch.choices[0].text; finish = ch.choices[0].finish_reason ?? finish; }
    if (ch.usage) usage = ch.usage;
  }
  return { choices: [{ text, finish_reason: finish }], usage };
}

// A linear-attention (Qwen3.5) model carves a fixed state per sequence out of
// the budget first: 6 sequences' state, then 9 blocks (one request of 128 tokens).
async function preemptingPool() {
  const cap = await capacity(["--max-model-len", "128", "--max-num-seqs", "6", "--kv-memory", "64MiB"]);
  if (!cap.state_bytes_per_sequence) return ["--kv-memory", "440KiB"];
  return ["--max-num-seqs", "6", "--kv-memory", String(6 * cap.state_bytes_per_sequence + 9 * cap.page_bytes)];
}

test("preemptions are counted in /metrics; preempted streams send no token twice", async () => {
  const s = await startServer(["--served-model-name", "mini", "--max-model-len", "128", ...(await preemptingPool())]);
  const body = (i) => ({ model: "mini", prompt: `Story number ${i}: once upon a time`, max_tokens: 60,
                         temperature: 0, ignore_eos: true });
  try {
    const c = new OpenAI({ baseURL: s.url + "/v1", apiKey: "unused", maxRetries: 0 });
    const rs = await Promise.all([0, 1, 2, 3, 4, 5].map((i) =>
      i % 2 ? streamText(c, body(i)) : c.completions.create(body(i))));
    for (const r of rs) {
      assert.equal(r.choices[0].finish_reason, "length");
      assert.equal(r.usage.completion_tokens, 60);
    }
    const m = await waitIdle(s.url);
    assert.ok(m.get("fp8kv:num_preemptions_total") > 0, "the pool was meant to be too small");
    const m0 = await waitIdle(srv.url);
    const want = await Promise.all([0, 1, 2, 3, 4, 5].map((i) => client.completions.create(body(i))));
    assert.equal((await waitIdle(srv.url)).get("fp8kv:num_preemptions_total"), m0.get("fp8kv:num_preemptions_total"));
    for (let i = 0; i < 6; i++) assert.equal(rs[i].choices[0].text, want[i].choices[0].text, `request ${i}`);
  } finally {
    await s.stop();
  }
});

// SIGTERM: running requests get --shutdown-grace to finish; those still
// running after it end with finish_reason "abort" (streams write their last
// chunk and [DONE]); the server exits 0.
test("SIGTERM: a request that finishes within the grace completes, the rest abort", async () => {
  for (const [grace, maxTokens, want] of [["30", 24, "length"], ["0.5", 3000, "abort"]]) {
    const s = await startServer(["--served-model-name", "mini", "--shutdown-grace", grace]);
    try {
      const c = new OpenAI({ baseURL: s.url + "/v1", apiKey: "unused", maxRetries: 0 });
      const st = await c.completions.create({ model: "mini", prompt: PROMPT, max_tokens: maxTokens, temperature: 0,
                                              ignore_eos: true, stream: true, stream_options: { include_usage: true } });
      let finish = null, usage = null, first = true;
      for await (const ch of st) {
        if (first) { first = false; s.proc.kill("SIGTERM"); }
        if (ch.choices.length) finish = ch.choices[0].finish_reason ?? finish;
        if (ch.usage) usage = ch.usage;
      }
      assert.equal(finish, want, `grace ${grace}`);
      if (want === "length") assert.equal(usage.completion_tokens, maxTokens);
      else assert.ok(usage.completion_tokens < maxTokens);
    } finally {
      await s.stop();  // exit 0
    }
  }
});

test("API key: 401 without it, public endpoints open, constant-time compared", async () => {
  const s = await startServer(["--api-key", "sekrit"]);
  try {
    const wrong = new OpenAI({ baseURL: s.url + "/v1", apiKey: "sekriT", maxRetries: 0 });
    const e = await status(wrong.models.list());
    assert.equal(e.status, 401);
    const none = await fetch(s.url + "/v1/models");
    assert.equal(none.status, 401);
    assert.equal((await none.json()).error.type, "authentication_error");
    assert.equal((await fetch(s.url + "/tokenize", { method: "POST", body: "{}" })).status, 401);
    const right = new OpenAI({ baseURL: s.url + "/v1", apiKey: "sekrit", maxRetries: 0 });
    const id = (await right.models.list()).data[0].id;
    const r = await right.completions.create({ model: id, prompt: PROMPT, max_tokens: 2 });
    assert.equal(r.choices[0].text.length > 0, true);
    for (const p of ["/health", "/metrics", "/version"]) assert.equal((await fetch(s.url + p)).status, 200, p);
  } finally {
    await s.stop();
  }
});

test("503 with Retry-After when the waiting queue is full", async () => {
  const s = await startServer(["--max-num-seqs", "1", "--max-waiting", "0"]);
  try {
    const post = (max_tokens) => fetch(s.url + "/v1/completions", {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: PROMPT, max_tokens, ignore_eos: true }) });
    const running = post(400);
    await new Promise((r) => setTimeout(r, 300));
    const r = await post(2);
    assert.equal(r.status, 503);
    assert.ok(Number(r.headers.get("retry-after")) >= 1);
    assert.equal((await r.json()).error.type, "service_unavailable_error");
    assert.equal((await running).status, 200);
  } finally {
    await s.stop();
  }
});
