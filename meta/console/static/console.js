// Live pages without a reload: when /console/events says this node applied a new version, fetch the page's
// content again (?fragment=1) and put it in place. No framework: one EventSource, one fetch at a time.
(function () {
  "use strict";
  if (document.body.dataset.live !== "on") return;
  var content = document.getElementById("content");
  var dot = document.getElementById("live");
  var busy = false, again = false;

  function editing() {
    var el = document.activeElement;
    return el && content.contains(el) && /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName);
  }

  function refresh() {
    if (busy) { again = true; return; }
    if (editing()) return;          // never throw away what someone is typing
    busy = true;
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    fetch(url.toString(), {credentials: "same-origin", cache: "no-store"}).then(function (r) {
      if (r.status === 401) { window.location.reload(); return null; }   // logged out: the server redirects
      return r.ok ? r.text() : null;
    }).then(function (html) {
      if (html !== null && html !== undefined) {
        content.innerHTML = html;
        document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
      }
    }).catch(function () { /* the next event tries again */ }).then(function () {
      busy = false;
      if (again) { again = false; refresh(); }
    });
  }

  var source = new EventSource("/console/events");
  source.addEventListener("open", function () { if (dot) dot.className = "on"; });
  source.addEventListener("error", function () { if (dot) dot.className = "off"; });
  source.addEventListener("change", refresh);
})();
