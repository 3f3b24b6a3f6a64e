// The Run page: pausing the header's live refresh (htmx polls while window.runLive !== false).
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-live-toggle]");
  if (!button) return;
  const paused = button.getAttribute("aria-pressed") !== "true";
  button.setAttribute("aria-pressed", String(paused));
  window.runLive = !paused;
  button.textContent = paused ? "Resume live updates" : "Pause live updates";
  const note = document.querySelector("[data-live-note]");
  if (note) note.textContent = paused ? "Live updates are paused." : "The status below refreshes every 2 seconds.";
});
