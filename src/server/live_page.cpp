// The page at "/": a prompt box, the answer streamed token by token and coloured by how each
// token was produced (an accepted draft or the target's own token, from the "qflash.pieces" of
// each chunk), and tau, the accept profile and tokens/s updated from every chunk. It polls
// /v1/stats to show whether the server is up, so it recovers by itself after a restart.
#include "server/server.h"

namespace qf {

const char* live_page_html() {
  return R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>qflash</title>
<link rel="icon" href="data:,">
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px system-ui,sans-serif;margin:1.5em auto;max-width:60em;padding:0 1em;color:#222}
h1{font-size:1.4em;margin:0 0 .2em} #status{color:#666;margin-bottom:1em}
#status.offline{color:#b00}
textarea{width:100%;box-sizing:border-box;font:13px ui-monospace,monospace;height:6em}
.row{display:flex;gap:1em;align-items:center;margin:.5em 0;flex-wrap:wrap}
button{font-size:14px;padding:.3em 1.2em}
#output{white-space:pre-wrap;font:13px ui-monospace,monospace;border:1px solid #ccc;border-radius:4px;
 padding:.6em;min-height:8em;background:#fcfcfc}
#output span{border-right:1px solid rgba(0,0,0,.12)} #output span.d{background:#c9f2c9} #output span.t{background:#cfe0ff} #output span.r{color:#777}
.legend span{padding:0 .4em;margin-right:.5em} .legend .d{background:#c9f2c9} .legend .t{background:#cfe0ff}
table{border-collapse:collapse;margin-top:.8em} td{padding:2px 14px 2px 0}
.bar{display:inline-block;height:11px;background:#48c;vertical-align:middle}
</style></head>
<body>
<h1>qflash</h1>
<div id="status">connecting...</div>
<textarea id="prompt" spellcheck="false">def parse_args(</textarea>
<div class="row">
 <label>mode <select id="mode"><option value="completion">completion</option><option value="chat">chat</option></select></label>
 <label>max tokens <input id="max-tokens" type="number" value="128" min="1" style="width:6em"></label>
 <button id="go">Generate</button><button id="stop" disabled>Stop</button>
 <span class="legend"><span class="d">accepted draft</span><span class="t">target token</span></span>
</div>
<div id="output"></div>
<table>
 <tr><td>tokens</td><td id="tokens">0</td></tr>
 <tr><td>tau (tokens per target pass)</td><td id="tau">-</td></tr>
 <tr><td>tokens/s</td><td id="tps">-</td></tr>
 <tr><td>finish</td><td id="finish">-</td></tr>
</table>
<div>accept profile (draft position: accepted / drafted)</div>
<div id="profile"></div>
<script>
"use strict";
const $ = id => document.getElementById(id);
let controller = null;

async function poll() {
  try {
    const r = await fetch('/v1/stats', {cache: 'no-store'});
    const s = await r.json();
    $('status').className = '';
    $('status').textContent = s.model + ' on ' + s.backend + ', draft ' + s.draft_source +
      ' | queue ' + s.queue.waiting + ' waiting' + (s.queue.busy ? ', engine busy' : '');
  } catch (e) {
    $('status').className = 'offline';
    $('status').textContent = 'server unreachable; retrying...';
  }
}

function showStats(s) {
  if (!s) return;
  $('tokens').textContent = s.generated_tokens;
  $('tau').textContent = s.rounds ? s.tau.toFixed(2) : '-';
  $('tps').textContent = s.tokens_per_second ? s.tokens_per_second.toFixed(1) : '-';
  $('profile').innerHTML = '';
  (s.accept_profile || []).forEach((p, i) => {
    const d = document.createElement('div');
    d.innerHTML = 'd' + (i + 1) + ' <span class="bar" style="width:' + Math.round(p * 300) + 'px"></span> ' + p.toFixed(2);
    $('profile').appendChild(d);
  });
}

function addPiece(text, draft, reasoning) {
  const span = document.createElement('span');
  span.className = (draft ? 'd' : 't') + (reasoning ? ' r' : '');
  span.textContent = text;
  $('output').appendChild(span);
}

function onChunk(c) {
  const choice = (c.choices || [])[0] || {};
  const delta = choice.delta || {};
  const q = c.qflash;
  if (q && q.pieces) q.pieces.forEach(p => addPiece(p.text, p.draft, delta.reasoning_content !== undefined));
  else if (delta.tool_calls) delta.tool_calls.forEach(t => addPiece('[tool call ' + t.function.name + ' ' + t.function.arguments + ']', false, false));
  if (q && q.stats) showStats(q.stats);
  if (choice.finish_reason) $('finish').textContent = choice.finish_reason;
  if (c.usage && c.usage.qflash) {
    const u = c.usage.qflash;
    showStats({generated_tokens: u.generated_tokens, rounds: u.rounds, tau: u.tau,
               tokens_per_second: u.tokens_per_second, accept_profile: u.accept_profile});
  }
}

async function generate() {
  $('output').textContent = '';
  $('finish').textContent = '-';
  showStats({generated_tokens: 0, rounds: 0, tau: 0, tokens_per_second: 0, accept_profile: []});
  const chat = $('mode').value === 'chat';
  const body = {stream: true, max_tokens: parseInt($('max-tokens').value, 10) || 128};
  if (chat) body.messages = [{role: 'user', content: $('prompt').value}];
  else body.prompt = $('prompt').value;
  controller = new AbortController();
  $('go').disabled = true; $('stop').disabled = false;
  try {
    const r = await fetch(chat ? '/v1/chat/completions' : '/v1/completions', {
      method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body),
      signal: controller.signal});
    if (!r.ok) {
      const e = await r.json().catch(() => ({}));
      $('finish').textContent = 'error ' + r.status + ': ' + ((e.error && e.error.message) || r.statusText);
      return;
    }
    const reader = r.body.getReader();
    const dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let at;
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const line = buf.slice(0, at); buf = buf.slice(at + 2);
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') continue;
        const c = JSON.parse(data);
        if (c.error) { $('finish').textContent = 'error: ' + c.error.message; continue; }
        onChunk(c);
      }
    }
  } catch (e) {
    $('finish').textContent = e.name === 'AbortError' ? 'stopped' : 'connection lost';
  } finally {
    $('go').disabled = false; $('stop').disabled = true; controller = null;
    poll();
  }
}

$('go').addEventListener('click', generate);
$('stop').addEventListener('click', () => { if (controller) controller.abort(); });
poll();
setInterval(poll, 2000);
</script></body></html>
)HTML";
}

}  // namespace qf
