//! The lines the CLI writes to stderr besides log records: events (`peer 2 up`), summaries
//! (`sent N messages`), warnings and the error it exits with. As plain text, or with
//! `--log-format json` as log records of target `busway_cli::say`, so that every stderr line
//! is then one JSON object of the same shape (timestamp, level, fields.message, target).

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// The log target of these lines; always enabled in JSON mode, whatever `BUSWAY_LOG` says.
pub(crate) const TARGET: &str = "busway_cli::say";

/// Whether lines go out as JSON log records; set once at start, before any line.
static JSON: AtomicBool = AtomicBool::new(false);

/// From now on, lines are JSON log records (the subscriber must enable `TARGET` at info).
pub(crate) fn use_json() {
    JSON.store(true, Relaxed);
}

/// What happened (an event, a summary).
pub(crate) fn info(line: impl Display) {
    if JSON.load(Relaxed) {
        tracing::info!(target: TARGET, "{line}");
    } else {
        eprintln!("{line}");
    }
}

/// Something the user should look at (an `--insecure` risk, a lost publish).
pub(crate) fn warn(line: impl Display) {
    if JSON.load(Relaxed) {
        tracing::warn!(target: TARGET, "{line}");
    } else {
        eprintln!("{line}");
    }
}

/// Why the command failed.
pub(crate) fn error(line: impl Display) {
    if JSON.load(Relaxed) {
        tracing::error!(target: TARGET, "{line}");
    } else {
        eprintln!("{line}");
    }
}
