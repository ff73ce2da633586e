// The task page's live panel: poll the task's progress while it runs, then reload.
"use strict";
(function () {
    const panel = document.getElementById("cq-live");
    if (!panel) {
        return;
    }
    const every = Number(panel.dataset.every) || 1000;
    const bar = panel.querySelector("progress");
    const percent = panel.querySelector(".cq-live-percent");
    const message = panel.querySelector(".cq-live-message");
    // The page's own read-only Progress and Message fields follow too.
    const fieldBar = document.querySelector(".field-progress_bar .readonly progress");
    const fieldMessage = document.querySelector(".field-message_text .readonly");

    async function tick() {
        try {
            const response = await fetch(panel.dataset.url, {
                credentials: "same-origin",
                headers: {"Accept": "application/json"},
            });
            if (response.ok) {
                const task = await response.json();
                if (task.progress !== null) {
                    const value = Math.round(task.progress * 100);
                    bar.value = value;
                    percent.textContent = value + "%";
                    if (fieldBar) {
                        fieldBar.value = value;
                        if (fieldBar.nextSibling) {
                            fieldBar.nextSibling.textContent = " " + value + "%";
                        }
                    }
                } else if (task.progress_invalid) {
                    // Not a number from 0 to 1 (NaN, Infinity...): say so, as the page does.
                    percent.textContent = panel.dataset.invalid;
                    if (fieldBar && fieldBar.nextSibling) {
                        fieldBar.nextSibling.textContent = " " + panel.dataset.invalid;
                    }
                }
                message.textContent = task.message === null ? "" : task.message;
                if (fieldMessage) {
                    fieldMessage.textContent = task.message === null ? "-" : task.message;
                }
                panel.dataset.status = task.status;
                panel.dataset.cancelRequested = task.cancel_requested ? "1" : "0";
                if (task.status !== "running") {
                    // Finished: the page itself shows the outcome.
                    window.location.reload();
                    return;
                }
            }
        } catch (error) {
            // A failed poll (server restarting, network) is retried on the next tick.
        }
        window.setTimeout(tick, every);
    }
    window.setTimeout(tick, every);
})();
