// The copy button of a ">>>" session copies only its code: the lines after the ">>> " and
// "... " prompts, without the prompts, the output or tracebacks, so that what you copy pastes
// into Python (a blank line ends each indented block, as the interactive prompt needs).
// Material's copy button copies the data-copy attribute of the code's nearest ancestor that
// has one, instead of the text, so each session's <pre> gets one.

function sessionCode(text) {
  const code = [];
  let inCode = false;
  let indented = false; // the statement so far has "... " lines: end it with a blank line
  for (const line of text.split("\n")) {
    if (line.startsWith(">>> ") || line === ">>>") {
      if (indented) code.push("");
      code.push(line.slice(4));
      inCode = true;
      indented = false;
    } else if (inCode && (line.startsWith("... ") || line === "...")) {
      code.push(line.slice(4));
      indented = true;
    } else {
      inCode = false; // output, or a traceback, up to the next prompt
    }
  }
  if (indented) code.push("");
  return code.map((line) => line.replace(/\s*# doctest: .*$/, "")).join("\n");
}

function markSessions(root) {
  for (const pre of root.querySelectorAll("div.highlight pre")) {
    const codeEl = pre.querySelector("code");
    if (!codeEl) continue;
    const text = codeEl.textContent;
    if (/^>>> /m.test(text)) pre.setAttribute("data-copy", sessionCode(text));
  }
}

if (typeof document$ !== "undefined") {
  // Material's observable of each page load, also with navigation.instant.
  document$.subscribe(() => markSessions(document));
} else if (typeof document !== "undefined") {
  document.addEventListener("DOMContentLoaded", () => markSessions(document));
}

if (typeof module !== "undefined") module.exports = { sessionCode };
