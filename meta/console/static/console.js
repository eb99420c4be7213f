// Live pages without a reload: fetch the page's content again (?fragment=1) and put it in place
// - when /console/events says this node applied a newer version than the page shows: the stream starts from the
//   version the page was drawn at (data-version), so a change applied between the page's load and the stream's
//   opening is not missed (a remap from the console's own form sealed its old segment in that gap, and the page
//   stayed at "sealing" for good);
// - every data-poll-ms on pages whose content changes without the log (a member's health, a broker's heartbeat).
// No framework: one EventSource, one fetch at a time.
(function () {
  "use strict";
  var body = document.body;
  if (body.dataset.live !== "on") return;
  var content = document.getElementById("content");
  var dot = document.getElementById("live");
  var busy = false, again = false, held = false;

  function editing() {
    var el = document.activeElement;
    return el && content.contains(el) && /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName);
  }

  // A field whose value is not the one the page was drawn with: someone typed it, maybe while a fetch was on its way
  function dirty() {
    var fields = content.querySelectorAll("input, textarea, select");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      if (f.type === "hidden" || f.type === "submit") continue;
      if (f.type === "checkbox" || f.type === "radio") { if (f.checked !== f.defaultChecked) return true; }
      else if (f.tagName === "SELECT") {
        var drawn = 0;   // the option drawn selected, else the first
        for (var j = 0; j < f.options.length; j++) if (f.options[j].defaultSelected) { drawn = j; break; }
        if (f.options.length && f.selectedIndex !== drawn) return true;
      } else if (f.value !== f.defaultValue) return true;
    }
    return false;
  }

  function refresh() {
    if (busy) { again = true; return; }
    if (editing()) { held = true; return; }   // never throw away what someone is typing: once they leave the form
    busy = true;
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    fetch(url.toString(), {credentials: "same-origin", cache: "no-store"}).then(function (r) {
      if (r.status === 401) { window.location.reload(); return null; }   // logged out: the server redirects
      return r.ok ? r.text() : null;
    }).then(function (html) {
      if (html === null || html === undefined) return;
      if (editing() || dirty()) {
        // Typed into while the fetch was on its way (the check above ran before it): kept, and drawn again once
        // the form is left (a console test's config form was submitted empty: its text replaced under the click)
        held = true;
        return;
      }
      content.innerHTML = html;
      body.dataset.refreshed = String(Number(body.dataset.refreshed || 0) + 1);
    }).catch(function () { /* the next event or poll tries again */ }).then(function () {
      busy = false;
      if (again) { again = false; refresh(); }
    });
  }

  content.addEventListener("focusout", function () {
    setTimeout(function () { if (held && !editing() && !dirty()) { held = false; refresh(); } }, 0);
  });

  var source = new EventSource("/console/events?after=" + encodeURIComponent(body.dataset.version || "0"));
  source.addEventListener("open", function () { if (dot) dot.className = "on"; });
  source.addEventListener("error", function () { if (dot) dot.className = "off"; });
  source.addEventListener("change", refresh);

  var poll = Number(body.dataset.pollMs || 0);
  // A tab nobody looks at asks nothing; it catches up when shown again
  if (poll > 0) setInterval(function () { if (!document.hidden) refresh(); }, poll);
  document.addEventListener("visibilitychange", function () { if (!document.hidden && poll > 0) refresh(); });
})();
