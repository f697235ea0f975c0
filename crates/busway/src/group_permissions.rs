//! Who may join and publish to which groups at this node (`NodeConfig::group_permissions`):
//! the rules are busway-core's (`busway_core::group::permissions`); this module keeps when
//! refused publishers were last told, behind its lock.

use busway_core::group::permissions::RefusalReports as Reports;
use busway_core::BusId;
use std::sync::Mutex;

/// When each publisher was last told that its publishes to a group are refused here.
#[derive(Default)]
pub(crate) struct RefusalReports {
    last: Mutex<Reports>,
}

impl RefusalReports {
    /// Whether to tell `publisher` now (`now_ms`) that its publishes to `group` are refused
    /// (see `busway_core::group::permissions::RefusalReports::due`).
    pub(crate) fn due(&self, publisher: BusId, group: &str, now_ms: u64) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.due(publisher, group, now_ms)
    }
}
