//! Why a configuration was refused: the setting, where it was written, and why.

use busway_core::error_kind::ErrorKind;
use std::fmt;

/// The top-level keys an environment variable `BUSWAY_<KEY>` may set (the file's, but for the
/// tables; `listen`, `connect` and `subtree` take comma-separated values).
pub(crate) const ENV_KEYS: [&str; 27] = [
    "id",
    "listen",
    "connect",
    "upstream",
    "subtree",
    "ttl",
    "relay_grace_ms",
    "direct_links",
    "shm_channels",
    "mem_channels",
    "group_logs",
    "shm_spins",
    "shm_ring_bytes",
    "secret_file",
    "io_threads",
    "frame_body_max",
    "send_queue_bytes_max",
    "inbox_bytes_max",
    "connections_max",
    "handshake_timeout_ms",
    "linger_ms",
    "heartbeat_interval_ms",
    "peer_dead_after_ms",
    "forget_after_ms",
    "dial_backoff_min_ms",
    "clock_skew_max_ms",
    "group_retain_bytes",
];

/// Why a configuration was refused (`NodeConfig::validate`, `from_toml*`, `TlsConfig`):
/// the setting it is about (a key, a `[table]`, an environment variable), the line of the file
/// that sets it when there is one, and the whole message, which names both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    setting: Option<String>,
    line: Option<usize>,
    message: String,
}

impl ConfigError {
    /// An error about `setting` (written at `line`, if known); `message` says what and where.
    pub(crate) fn new(setting: Option<&str>, line: Option<usize>, message: String) -> Self {
        Self {
            setting: setting.map(str::to_owned),
            line,
            message,
        }
    }

    /// An error whose message starts with the setting's name, as `NodeConfig::validate`'s
    /// mostly do; the first word names the setting only if it is one (a file's key, or a
    /// table: `tls`, `etcd`, `group_permissions`).
    pub(crate) fn of_setting(message: String) -> Self {
        const TABLES: [&str; 4] = ["tls", "etcd", "etcd.endpoints", "group_permissions"];
        let first = message.split_whitespace().next().unwrap_or_default();
        let first = first.trim_end_matches(':');
        let known = ENV_KEYS.contains(&first) || TABLES.contains(&first);
        Self {
            setting: known.then(|| first.to_owned()),
            line: None,
            message,
        }
    }

    /// The same error, at line `line` of the file (its message's own line number too).
    pub(crate) fn at_line(mut self, line: usize) -> Self {
        if let Some(old) = self.line {
            self.message =
                self.message
                    .replacen(&format!("line {old}"), &format!("line {line}"), 1);
        }
        self.line = Some(line);
        self
    }

    /// The same error, its message said of a wider place (a file, the environment).
    pub(crate) fn within(mut self, place: &str) -> Self {
        self.message = format!("{place}: {}", self.message);
        self
    }

    /// The same error about another setting (an environment variable that set the key).
    pub(crate) fn about(mut self, setting: &str) -> Self {
        self.setting = Some(setting.to_owned());
        self.line = None;
        self
    }

    /// The setting the error is about, if one is known: a key (`linger_ms`), a table
    /// (`[tls]`), or an environment variable (`BUSWAY_LINGER_MS`).
    pub fn setting(&self) -> Option<&str> {
        self.setting.as_deref()
    }

    /// The line of the file that sets it (from 1), if the configuration came from a file.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// What kind of failure this is: always [`ErrorKind::Config`].
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::Config
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// For callers that report errors as text (the CLI's commands).
impl From<ConfigError> for String {
    fn from(e: ConfigError) -> String {
        e.message
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_word_names_the_setting_only_when_it_is_one() {
        let e = ConfigError::of_setting("linger_ms is 0; it must be 1..".into());
        assert_eq!(e.setting(), Some("linger_ms"));
        let e = ConfigError::of_setting("etcd.endpoints: at least one etcd URL".into());
        assert_eq!(e.setting(), Some("etcd.endpoints"));
        let e = ConfigError::of_setting("tls://127.0.0.1:1 needs TLS: set tls".into());
        assert_eq!(e.setting(), None, "an address is no setting");
        let e = ConfigError::of_setting("this node's certificate names bus ids 1".into());
        assert_eq!(e.setting(), None);
        assert_eq!(e.kind(), ErrorKind::Config);
    }
}
