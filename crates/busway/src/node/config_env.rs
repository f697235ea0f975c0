//! A node's configuration from a TOML file with environment variables over it
//! (`NodeConfig::from_toml_with_env`): `BUSWAY_<KEY>` sets the file's top-level key `<key>`,
//! and an error names the variable rather than a line of a text the user never wrote.

use crate::node::config::NodeConfig;
use crate::node::config_error::{ConfigError, ENV_KEYS};

/// The TOML line for `key` set to `value` from the environment.
fn env_line(key: &str, value: &str) -> String {
    let quoted = |s: &str| toml_string(s.trim());
    let list = |quote: bool| {
        let items: Vec<String> = value
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| {
                if quote {
                    quoted(s)
                } else {
                    s.trim().to_owned()
                }
            })
            .collect();
        format!("[{}]", items.join(", "))
    };
    let v = match key {
        "listen" | "connect" => list(true),
        "subtree" => list(false),
        "upstream" | "secret_file" => quoted(value),
        // Numbers and booleans as written; anything else is a wrong type, named as such.
        _ if value.trim().parse::<i64>().is_ok() || matches!(value.trim(), "true" | "false") => {
            value.trim().to_owned()
        }
        _ => quoted(value),
    };
    format!("{key} = {v}")
}

/// `s` as a TOML basic string.
/// Whether `text` names the setting `key` as a word (not inside a longer key).
fn names_key(text: &str, key: &str) -> bool {
    let is_key_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(key).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + key.len()..].chars().next();
        !before.is_some_and(is_key_char) && !after.is_some_and(is_key_char)
    })
}

fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `text` with the top-level settings of `keys` commented out (a multi-line array to its
/// closing bracket).
fn without_keys(text: &str, keys: &[&str]) -> String {
    let mut out = Vec::new();
    let mut in_table = false;
    let mut skipping_array = false;
    for line in text.lines() {
        let t = line.trim_start();
        if skipping_array {
            skipping_array = !t.contains(']');
            out.push(format!("# {line}"));
            continue;
        }
        in_table |= t.starts_with('[') && !t.contains('=');
        let key = t.split('=').next().unwrap_or_default().trim();
        if !in_table && t.contains('=') && keys.contains(&key) {
            let value = t.split_once('=').map_or("", |(_, v)| v.trim());
            skipping_array = value.starts_with('[') && !value.contains(']');
            out.push(format!("# {line}"));
        } else {
            out.push(line.to_owned());
        }
    }
    out.join("\n")
}

impl NodeConfig {
    /// [`NodeConfig::from_toml`] of `text` with settings from `vars` (e.g. `std::env::vars()`)
    /// over it: `BUSWAY_<KEY>` sets the top-level key `<key>` (`BUSWAY_LINGER_MS=500`;
    /// `BUSWAY_LISTEN=tcp://a:1,unix:///b`; `BUSWAY_SUBTREE=100,199`). Other variables are
    /// ignored. An error in the file names its line; one in a variable names the variable.
    pub fn from_toml_with_env(
        text: &str,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<NodeConfig, ConfigError> {
        let mut set: Vec<(String, &'static str, String)> = Vec::new();
        for (name, value) in vars {
            let Some(key) = name.strip_prefix("BUSWAY_") else {
                continue;
            };
            let key = key.to_ascii_lowercase();
            if let Some(&k) = ENV_KEYS.iter().find(|&&k| k == key) {
                set.retain(|(_, kk, _)| *kk != k);
                set.push((name, k, value));
            }
        }
        if set.is_empty() {
            return NodeConfig::from_toml(text);
        }
        NodeConfig::from_toml(text)?;
        let lines: Vec<String> = set.iter().map(|(_, k, v)| env_line(k, v)).collect();
        if let Err(e) = NodeConfig::from_toml(&lines.join("\n")) {
            // Name the variable rather than a line of a text the user never wrote.
            let culprit = e
                .line()
                .filter(|&n| (1..=lines.len()).contains(&n))
                .or_else(|| {
                    set.iter()
                        .position(|(_, k, _)| Some(*k) == e.setting())
                        .map(|i| i + 1)
                });
            return Err(match culprit {
                Some(n) => e.within(&set[n - 1].0).about(&set[n - 1].0),
                None => e.within("environment (BUSWAY_*)"),
            });
        }
        let keys: Vec<&str> = set.iter().map(|(_, k, _)| *k).collect();
        let merged = format!("{}\n{}", lines.join("\n"), without_keys(text, &keys));
        // The variables' lines come first in `merged`: an error on one names its variable, an
        // error on the file's names the file's own line.
        NodeConfig::from_toml(&merged).map_err(|e| {
            // An error of two settings (the file's, and one a variable set) names the
            // variables it is about as well.
            let text = e.to_string();
            let named: Vec<&str> = set
                .iter()
                .filter(|(_, k, _)| names_key(&text, k))
                .map(|(var, _, _)| var.as_str())
                .collect();
            let place = match named.is_empty() {
                true => "the file with BUSWAY_* variables over it".to_owned(),
                false => format!("the file with {} over it", named.join(", ")),
            };
            match e.line() {
                Some(n) if (1..=lines.len()).contains(&n) => {
                    e.within(&set[n - 1].0).about(&set[n - 1].0)
                }
                Some(n) => e.at_line(n - lines.len()).within(&place),
                None => e.within(&place),
            }
        })
    }
}
