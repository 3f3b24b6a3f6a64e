// The Runs pages: pause/resume the live rows, keep ticked rows ticked across refreshes, select
// all on the page, and swap the example input when another agent is chosen. Every page works
// without this script (the rows then do not refresh by themselves).
(() => {
  let paused = false;

  document.addEventListener("click", (event) => {
    const toggle = event.target.closest("[data-live-toggle]");
    if (!toggle) return;
    paused = !paused;
    toggle.setAttribute("aria-pressed", String(paused));
    toggle.textContent = paused ? "Resume live updates" : "Pause live updates";
    const note = document.querySelector("[data-live-note]");
    if (note) note.textContent = paused ? "Live updates paused." : "Statuses refresh every 2 seconds.";
  });

  // Polling stays scheduled; while paused each request is called off before it is sent.
  document.addEventListener("htmx:beforeRequest", (event) => {
    if (paused && event.detail.elt.id === "run-rows") event.preventDefault();
  });

  let ticked = [];
  document.addEventListener("htmx:beforeSwap", (event) => {
    if (event.detail.target.id !== "run-rows") return;
    if (/<html[\s>]/i.test(event.detail.serverResponse || "")) {
      // a whole page (signed out: the login page) is no rows: show it as the page instead
      event.detail.shouldSwap = false;
      window.location.reload();
      return;
    }
    ticked = [...event.detail.target.querySelectorAll("input[name=run]:checked")].map((box) => box.value);
  });
  document.addEventListener("htmx:afterSwap", (event) => {
    if (event.detail.target.id !== "run-rows") return;
    for (const box of event.detail.target.querySelectorAll("input[name=run]")) {
      if (ticked.includes(box.value)) box.checked = true;
    }
  });

  document.addEventListener("change", (event) => {
    if (event.target.matches("[data-select-all]")) {
      for (const box of document.querySelectorAll("#run-rows input[name=run]")) {
        box.checked = event.target.checked;
      }
    }
    if (event.target.matches(".start-run select[name=agent]")) {
      const examples = JSON.parse(document.getElementById("agent-examples").textContent);
      const input = document.querySelector(".start-run textarea[name=input]");
      const shown = Object.values(examples);
      // only replace what the person has not edited: an example, or nothing
      if (input && (input.value.trim() === "" || shown.includes(input.value))) {
        input.value = examples[event.target.value] ?? "{}";
      }
      for (const hint of document.querySelectorAll(".start-run [data-agent-description], .start-run details.schema")) {
        hint.hidden = true;  // they describe the agent chosen before
      }
    }
  });
})();
