//! Why a configuration was refused: the setting, where it was written, and why.

use busway_core::error_kind::ErrorKind;
use std::fmt;

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

    /// An error whose message starts with the setting's name, as `NodeConfig::validate`'s do.
    pub(crate) fn of_setting(message: String) -> Self {
        let setting = message
            .split([' ', ':'])
            .next()
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        Self {
            setting,
            line: None,
            message,
        }
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
