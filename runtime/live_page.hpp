#pragma once
// The page a job's status server serves at "/": a live view of the running
// job, drawn in the browser from the server's "/status" JSON.

#include <string>

namespace asgd::pages {

/// The whole page, self-contained (Chart.js inlined; no request but its own
/// polls). Once a second it fetches "status" relative to the page's URL
/// (/status when served at /) and redraws: headline numbers (state,
/// epoch/epochs, progress, ETA, samples/s, loss, validation accuracy), line
/// charts of samples/s, training loss and validation accuracy over wall_s
/// from the history of its own polls, bars of each worker's clock and each
/// shard's updates applied, and a table of workers. A failed fetch shows "job
/// not reachable" and polling goes on. The /status object it reads is the
/// one docs/user-guide.md describes (state, policy, model, dataset, workers,
/// shards, epochs, wall_s, epoch, progress, eta_s, samples, total_samples,
/// samples_per_s, updates, train_loss, val_accuracy, rejected, worker[],
/// shard[]); missing or null fields show as "–".
///
/// Like report.html it keeps <pre id="asgd-render-status"> current with
/// {charts, errors, polls, reachable}, for tests. The same text every call:
/// nothing of a job is in it. Thread-safe.
std::string live_status_page_html();

}  // namespace asgd::pages
