//! Warnings that repeat, such as a flood of bad handshakes from one address, are logged at
//! most once per `WARN_WINDOW_MS` per key (the warning's kind and the remote IP), each with
//! the count of those held back since the last one logged. The counters and events still see
//! every one.

use std::collections::HashMap;
use std::sync::Mutex;

/// Shortest time between two logged warnings of one key, in milliseconds.
pub(crate) const WARN_WINDOW_MS: u64 = 10_000;
/// Keys remembered at once; past it the expired ones are forgotten, and if none is, all are
/// (a flood from many addresses is then logged once per address again, never silenced).
pub(crate) const WARN_KEYS_MAX: usize = 4_096;

/// Per key: when its last warning was logged, and how many were held back since.
#[derive(Default)]
pub(crate) struct WarnLimiter {
    keys: Mutex<HashMap<String, (u64, u64)>>,
}

impl WarnLimiter {
    /// Whether to log a warning of `key` at `now_ms`: `Some(held)` (how many of its warnings
    /// were held back since the last one logged), or `None` to hold this one back.
    pub(crate) fn admit(&self, key: &str, now_ms: u64) -> Option<u64> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((logged_at, held)) = keys.get_mut(key) {
            if now_ms.saturating_sub(*logged_at) < WARN_WINDOW_MS {
                *held += 1;
                return None;
            }
            let was = std::mem::take(held);
            *logged_at = now_ms;
            return Some(was);
        }
        if keys.len() >= WARN_KEYS_MAX {
            keys.retain(|_, (at, _)| now_ms.saturating_sub(*at) < WARN_WINDOW_MS);
            if keys.len() >= WARN_KEYS_MAX {
                keys.clear();
            }
        }
        keys.insert(key.to_owned(), (now_ms, 0));
        Some(0)
    }
}

/// The IP part of a remote address (`tcp://1.2.3.4:5678` -> `tcp://1.2.3.4`): one key for
/// every connection from a host, whatever its port.
pub(crate) fn host_of(remote: &str) -> &str {
    match remote.rfind(':') {
        Some(i) if remote[i + 1..].bytes().all(|b| b.is_ascii_digit()) && i > 6 => &remote[..i],
        _ => remote,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_warning_is_logged_once_per_window_with_the_count_held_back() {
        let l = WarnLimiter::default();
        assert_eq!(l.admit("bad handshake 1.2.3.4", 0), Some(0));
        for t in 1..=5 {
            assert_eq!(l.admit("bad handshake 1.2.3.4", t), None);
        }
        assert_eq!(l.admit("bad handshake 5.6.7.8", 6), Some(0), "another key");
        assert_eq!(l.admit("bad handshake 1.2.3.4", WARN_WINDOW_MS), Some(5));
        assert_eq!(l.admit("bad handshake 1.2.3.4", WARN_WINDOW_MS + 1), None);
    }

    #[test]
    fn many_keys_never_silence_a_new_one() {
        let l = WarnLimiter::default();
        for i in 0..WARN_KEYS_MAX + 10 {
            assert_eq!(l.admit(&format!("k{i}"), 0), Some(0));
        }
    }

    #[test]
    fn the_host_of_a_remote_address_drops_its_port() {
        assert_eq!(host_of("tcp://127.0.0.1:40000"), "tcp://127.0.0.1");
        assert_eq!(host_of("tcp://[::1]:40000"), "tcp://[::1]");
        assert_eq!(host_of("unix:///tmp/x.sock"), "unix:///tmp/x.sock");
    }
}
