// The artifact editor on an approval's page: the JSON is parsed as it is typed, and the
// "approve with these edits" button stays disabled, with the parser's complaint beside the
// field, until it parses. The server parses it again: this only saves a round trip.
(function () {
  "use strict";

  function check(editor, submit, error) {
    var problem = "";
    try {
      if (JSON.parse(editor.value) === null) problem = "The edited artifact cannot be null.";
    } catch (e) {
      problem = "Not valid JSON: " + e.message;
    }
    error.textContent = problem;
    submit.disabled = problem !== "";
    if (problem) editor.setAttribute("aria-invalid", "true");
    else editor.removeAttribute("aria-invalid");
    editor.closest(".field").classList.toggle("invalid", problem !== "");
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("form[data-decision-form]").forEach(function (form) {
      var editor = form.querySelector("[data-json-editor]");
      var submit = form.querySelector("[data-json-submit]");
      var error = form.querySelector("#artifact-error");
      if (!editor || !submit || !error) return;
      var serverSaid = error.textContent.trim() !== "";
      editor.addEventListener("input", function () { check(editor, submit, error); });
      if (!serverSaid) check(editor, submit, error); // keep the server's message until an edit
    });
  });
})();
