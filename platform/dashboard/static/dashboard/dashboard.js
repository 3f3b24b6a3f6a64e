// Small progressive enhancements; every page works without them.
document.addEventListener("change", (event) => {
  // The tenant switcher: go to the chosen tenant's runs.
  const select = event.target.closest("[data-tenant-switch] select");
  if (select) select.form.submit();
});
