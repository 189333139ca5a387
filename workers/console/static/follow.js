// The live transcript: each server-sent line is appended as text (never as HTML).
(function () {
  var live = document.getElementById("live");
  var pre = document.getElementById("transcript");
  if (!live || !pre || !window.EventSource) { return; }
  pre.textContent = "";
  var source = new EventSource(live.getAttribute("data-follow"));
  source.onmessage = function (e) {
    var line = JSON.parse(e.data);
    var span = document.createElement("span");
    span.className = "line";
    span.textContent = line.text + "\n";
    pre.appendChild(span);
  };
  source.addEventListener("settled", function () {
    source.close();
    live.textContent = "the turn settled";
    window.location.reload();
  });
})();
