// Live pages: when the server says the database changed, re-render <main> in place.
// Without JavaScript every page still works; it is just not live.
(function () {
  "use strict";
  if (document.body.dataset.live !== "yes" || !window.EventSource) return;
  var busy = false, again = false;
  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(window.location.href, { headers: { "X-Fragment": "1" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html !== null && !document.activeElement.closest("form")) {
          document.getElementById("page").innerHTML = html;
        }
      })
      .finally(function () { busy = false; if (again) { again = false; refresh(); } });
  }
  var events = new EventSource(document.body.dataset.events);
  events.addEventListener("changed", refresh);
})();
