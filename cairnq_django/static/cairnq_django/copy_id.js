// The task list shows shortened ids; give each a button that copies the full one.
"use strict";
(function () {
    const ICON = '<svg viewBox="0 0 16 16" width="12" height="12" aria-hidden="true">' +
        '<rect x="5" y="5" width="9" height="9" rx="1" fill="none" stroke="currentColor" stroke-width="1.5"/>' +
        '<path d="M3 11V3a1 1 0 0 1 1-1h7" fill="none" stroke="currentColor" stroke-width="1.5"/></svg>';

    function copy(text) {
        // The Clipboard API needs a secure context (https or localhost).
        if (navigator.clipboard && window.isSecureContext) {
            return navigator.clipboard.writeText(text);
        }
        const area = document.createElement("textarea");
        area.value = text;
        area.setAttribute("readonly", "");
        area.style.position = "fixed";
        area.style.opacity = "0";
        document.body.appendChild(area);
        area.select();
        const done = document.execCommand("copy");
        area.remove();
        return done ? Promise.resolve() : Promise.reject(new Error("copy refused"));
    }

    document.addEventListener("DOMContentLoaded", function () {
        for (const id of document.querySelectorAll("#result_list .field-short_id .cq-id[title]")) {
            const button = document.createElement("button");
            button.type = "button";
            button.className = "cq-copy";
            button.dataset.copy = id.title;
            button.title = "Copy " + id.title;
            button.setAttribute("aria-label", "Copy task id " + id.title);
            button.innerHTML = ICON;
            (id.closest("a") || id).after(button);
        }
    });
    document.addEventListener("click", function (event) {
        const button = event.target.closest("button.cq-copy");
        if (!button) {
            return;
        }
        event.preventDefault();
        copy(button.dataset.copy).then(
            () => button.classList.add("cq-copied"),
            () => button.classList.add("cq-copy-failed"),
        );
        setTimeout(() => button.classList.remove("cq-copied", "cq-copy-failed"), 1500);
    });
})();
