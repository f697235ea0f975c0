//! The group logs a ring reader reads beside the peer's ring: the offers it takes (each log
//! lives and dies with the ring that offered it), its reads of them, and their watches.

use super::RingReader;
use crate::limits::GROUP_LOG_READ_BYTES_MAX;
use crate::node::stats::bump;
use busway_core::frame::FrameKind;
use busway_core::group::{encode_log_answer, LogOffer};
use bytes::{Bytes, BytesMut};
use std::sync::atomic::Ordering::Relaxed;

impl RingReader {
    /// Reads each log attached to this ring and hands its publishes to the node as if they
    /// had come by the ring (passed on, and delivered in their stream's order; a gap is asked
    /// for). A log the node no longer wants is let go (the publisher dropped this node as its
    /// reader when it read the INTEREST that gave the group up); a log that lies is let go and
    /// declined, so the publisher sends by the link again. True if publishes went to the inbox.
    pub(super) fn read_logs(&mut self) -> bool {
        self.looks_since_log_records = self.looks_since_log_records.saturating_add(1);
        // Most looks find nothing new: one load of each log's end, and out.
        if !self.logs.iter().any(|l| l.reader.is_readable()) {
            return false;
        }
        let Some(node) = self.link.node.upgrade() else {
            return false;
        };
        let src = self.link.peer.id;
        let mut handed = false;
        let mut i = 0;
        while i < self.logs.len() {
            let mut buf = BytesMut::new();
            let mut spans = Vec::new();
            let log = &mut self.logs[i];
            let read = log
                .reader
                .read_into(GROUP_LOG_READ_BYTES_MAX, &mut buf, &mut spans)
                .map_err(|e| e.to_string());
            let read = match read {
                Ok(r) if r.records > 0 => {
                    if !node.wants_group(&log.group) {
                        // Declined, so that the publisher stops writing for this node
                        // (its INTEREST leave says so too, unless it did not fit); kept
                        // until the decline fits.
                        let answer = encode_log_answer(&log.group, log.token, log.serial, false);
                        if self
                            .link
                            .peer
                            .push_framed(FrameKind::GroupLog, &answer, &Bytes::new())
                            .is_ok()
                        {
                            self.drop_log(i);
                        } else {
                            i += 1;
                        }
                        continue;
                    }
                    let chunk = buf.freeze();
                    node.sort_out_log(src, &log.group, &chunk, &spans).map(|h| {
                        handed |= h;
                        r
                    })
                }
                other => other,
            };
            match read {
                Ok(r) if r.records == 0 => {
                    i += 1;
                    continue;
                }
                Ok(r) => {
                    self.looks_since_log_records = 0;
                    if r.overrun {
                        bump(&self.link.counters.group_log_overruns);
                    }
                    self.link
                        .counters
                        .group_log_reads
                        .fetch_add(r.records as u64, Relaxed);
                    i += 1;
                }
                Err(why) => {
                    tracing::warn!(peer = %src, group = &*log.group, %why, "the peer's group log cannot be read: its publishes go by the link again");
                    bump(&self.link.counters.protocol_errors);
                    let answer = encode_log_answer(&log.group, log.token, log.serial, false);
                    let _ = self
                        .link
                        .peer
                        .push_framed(FrameKind::GroupLog, &answer, &Bytes::new());
                    self.drop_log(i);
                }
            }
        }
        handed
    }

    pub(super) fn drop_log(&mut self, i: usize) {
        self.logs.swap_remove(i);
        self.refresh_watches();
    }

    /// The waiter thread looks at the logs attached now.
    pub(super) fn refresh_watches(&self) {
        let mut w = self.watches.lock().unwrap_or_else(|p| p.into_inner());
        *w = self.logs.iter().map(|l| l.reader.watch()).collect();
    }

    /// The peer's offer of its log of a group, read from its ring: the log is opened and
    /// attached to this ring (replacing one of the same group) and accepted, or declined with
    /// a warning that says why.
    pub(super) fn take_log_offer(&mut self, offer: LogOffer<'_>) {
        let Some(node) = self.link.node.upgrade() else {
            return;
        };
        let src = self.link.peer.id;
        let (name, token, serial) = (offer.name, offer.token, offer.serial);
        let accept = match node.open_log(src, &offer) {
            Ok(log) => {
                self.logs.retain(|l| *l.group != *name);
                self.logs.push(log);
                self.refresh_watches();
                true
            }
            Err(why) => {
                tracing::warn!(peer = %src, group = name, %why, "declined the peer's group log");
                false
            }
        };
        let answer = encode_log_answer(name, token, serial, accept);
        let _ = self
            .link
            .peer
            .push_framed(FrameKind::GroupLog, &answer, &Bytes::new());
    }
}
