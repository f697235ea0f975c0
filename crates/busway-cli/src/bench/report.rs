//! What a benchmark worker reports (one JSON line on its stdout).

use serde::{Deserialize, Serialize};

/// What each side reports.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub(crate) struct Report {
    pub(crate) msgs: u64,
    pub(crate) bytes: u64,
    /// Seconds from the first to the last message (receiver) or of sending (sender).
    pub(crate) secs: f64,
    pub(crate) cpu_secs: f64,
    /// Wall seconds the process lived, for CPU%.
    pub(crate) wall_secs: f64,
    pub(crate) peak_rss_kib: u64,
    /// Round trips (`--round-trips`): percentiles in microseconds.
    #[serde(default)]
    pub(crate) rtt_us: [f64; 3],
}
