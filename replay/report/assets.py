"""The page's one stylesheet and one script, inline (the page fetches nothing).

The script only sorts and filters the ops table; everything else reads without JavaScript. The
Content-Security-Policy of the page (``page.py``) lets exactly this script run, by its hash, and
nothing else: an attribute or element that escaped escaping could still not run script, nor
fetch anything (``default-src 'none'``). Handlers are attached with ``addEventListener``: CSP
forbids inline ``on...=`` attributes, ours included.
"""

from __future__ import annotations

__all__ = ["STYLE", "SCRIPT"]

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1100px;
padding:0 16px 48px;color:#1d1d1f;background:#fff}
h1{font-size:22px;margin:20px 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
code,pre,.mono{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace;font-size:12.5px}
pre{background:#f6f6f8;padding:8px 10px;overflow-x:auto;margin:4px 0;border-radius:4px}
pre .hit{background:#ffe1e1;display:inline-block;min-width:100%}
table{border-collapse:collapse;margin:4px 0}td,th{padding:3px 8px;text-align:left;vertical-align:top}
table.kv th{color:#555;font-weight:600;white-space:nowrap}
table.grid{font-size:12.5px;width:100%}table.grid th{background:#f0f0f3;position:sticky;top:0}
table.grid td,table.grid th{border-bottom:1px solid #eee;white-space:nowrap}
table.grid td.num{text-align:right;font-variant-numeric:tabular-nums}
table.grid th[data-sort]{cursor:pointer}table.grid th[aria-sort=ascending]:after{content:" ▲"}
table.grid th[aria-sort=descending]:after{content:" ▼"}
tr.culprit td{background:#ffe1e1;font-weight:600}tr.producer td,tr.raised td{color:#b00020}
tr.propagator td{color:#a05a00}tr.exempt td{color:#777}
.scroll{max-height:520px;overflow:auto;border:1px solid #eee}
.verdict{border-left:5px solid #b00020;padding:6px 14px;background:#fff7f7}
.verdict.healthy{border-color:#2e7d32;background:#f4fbf4}
.note{color:#555}.warn{color:#a05a00}.bad{color:#b00020;font-weight:600}.ok{color:#2e7d32}
.sev-error{color:#b00020;font-weight:600}.sev-warning{color:#a05a00;font-weight:600}
.sev-info{color:#555}
svg.plot,svg.heat{width:100%;max-width:860px;height:auto;display:block;margin:6px 0}
svg text{font:11px system-ui,sans-serif;fill:#333}svg text.title{font-weight:600;font-size:12px}
svg text.axis{text-anchor:end;fill:#666}svg text.axis.step{text-anchor:start}
svg text.axis.step.end{text-anchor:end}svg .frame{fill:none;stroke:#ccc}
svg .window{fill:#e3f0ff}svg .line{fill:none;stroke:#1f5fbf;stroke-width:1.3}
svg circle.line{fill:#1f5fbf}svg .nonfinite line{stroke:#b00020;stroke-width:1.5}
svg .mark line{stroke:#888;stroke-dasharray:3 3}svg .mark.bad line{stroke:#b00020;stroke-width:2;
stroke-dasharray:none}svg .mark.bad text{fill:#b00020;font-weight:700}
svg .mark.symptom line{stroke:#a05a00}svg rect.bad{fill:#b00020}
.legend span{margin-right:14px}.legend .sw{display:inline-block;width:12px;height:10px;
margin-right:4px;vertical-align:middle}
#ops-filter{margin:4px 0;padding:3px 6px;width:320px}
footer{margin-top:32px;color:#777;font-size:12px}
"""

# Sorting: a header click sorts by its column (numbers as numbers); filtering: every row whose
# text holds all the words typed. Rows are moved, never rebuilt from strings: no HTML is made.
SCRIPT = """
(function () {
  var table = document.getElementById("ops");
  if (!table) return;
  var body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);
  var box = table.parentNode;
  var culprit = body.querySelector("tr.culprit");
  if (culprit) box.scrollTop = culprit.offsetTop - box.clientHeight / 2;
  var input = document.createElement("input");
  input.id = "ops-filter";
  input.type = "search";
  input.placeholder = "filter ops: words in any column (aten::mul backward)";
  table.parentNode.parentNode.insertBefore(input, table.parentNode);
  input.addEventListener("input", function () {
    var words = input.value.toLowerCase().split(/\\s+/).filter(Boolean);
    rows.forEach(function (r) {
      var text = r.textContent.toLowerCase();
      r.hidden = !words.every(function (w) { return text.indexOf(w) >= 0; });
    });
  });
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
    if (!th.hasAttribute("data-sort")) return;
    th.addEventListener("click", function () {
      var up = th.getAttribute("aria-sort") !== "ascending";
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (o) {
        o.removeAttribute("aria-sort");
      });
      th.setAttribute("aria-sort", up ? "ascending" : "descending");
      var num = th.getAttribute("data-sort") === "num";
      var key = function (r) {
        var c = r.cells[col];
        var v = c.getAttribute("data-v");
        if (num) { var x = parseFloat(v === null ? c.textContent : v); return isNaN(x) ? Infinity : x; }
        return c.textContent;
      };
      rows.sort(function (a, b) {
        var ka = key(a), kb = key(b);
        var d = ka < kb ? -1 : ka > kb ? 1 : 0;
        return up ? d : -d;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
})();
"""
