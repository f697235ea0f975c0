//! A node's configuration from a TOML file (`NodeConfig::from_toml`): every setting of
//! [`NodeConfig`] under its own name, each optional (a missing one keeps its default). An
//! unknown key, a wrong type, an address that does not parse or a value `NodeConfig::validate`
//! refuses is an error naming the key and its line. `docs/busway.toml` is the commented
//! example (`busway config example` prints it), every key at its default.

use crate::addr::Addr;
use crate::node::config::{IoThreads, NodeConfig};
use crate::node::config_error::ConfigError;
use busway_core::handshake::Secret;
use busway_core::BusId;
use serde::Deserialize;
use std::path::PathBuf;
use toml::Spanned;

/// The file's shape: `NodeConfig`'s fields, all optional.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    id: Option<u64>,
    listen: Option<Vec<Spanned<String>>>,
    connect: Option<Vec<Spanned<String>>>,
    upstream: Option<Spanned<String>>,
    subtree: Option<[u64; 2]>,
    ttl: Option<u8>,
    relay_grace_ms: Option<u64>,
    direct_links: Option<bool>,
    shm_channels: Option<bool>,
    mem_channels: Option<bool>,
    group_logs: Option<bool>,
    shm_spins: Option<u32>,
    shm_ring_bytes: Option<usize>,
    secret_file: Option<Spanned<PathBuf>>,
    io_threads: Option<usize>,
    frame_body_max: Option<usize>,
    send_queue_bytes_max: Option<usize>,
    inbox_bytes_max: Option<usize>,
    connections_max: Option<usize>,
    handshake_timeout_ms: Option<u64>,
    linger_ms: Option<u64>,
    heartbeat_interval_ms: Option<u64>,
    peer_dead_after_ms: Option<u64>,
    forget_after_ms: Option<u64>,
    dial_backoff_min_ms: Option<u64>,
    clock_skew_max_ms: Option<u64>,
    group_retain_bytes: Option<usize>,
    tls: Option<Spanned<TlsFiles>>,
    etcd: Option<Spanned<EtcdTable>>,
    group_permissions: Option<Vec<Spanned<RuleTable>>>,
}

/// One `[[group_permissions]]` table: a rule (see `GroupRule`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleTable {
    ids: [u64; 2],
    join: Option<Vec<String>>,
    publish: Option<Vec<String>>,
}

/// The `[etcd]` table: discovery (see `EtcdConfig`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EtcdTable {
    endpoints: Vec<String>,
    prefix: Option<String>,
    lease_ttl_secs: Option<u64>,
}

/// The `[tls]` table: PEM files.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

/// The 1-based line of byte `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at.min(text.len())].matches('\n').count() + 1
}

/// The line where `key` is set (`key =` at the start of a line, or a `[key]` table), if any.
fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            let l = l.trim_start();
            l.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
                || l == format!("[{key}]")
        })
        .map(|i| i + 1)
}

fn addr(text: &str, key: &str, s: &Spanned<String>) -> Result<Addr, ConfigError> {
    s.get_ref().parse().map_err(|e| {
        let line = line_of(text, s.span().start);
        let message = format!(
            "{key} at line {}: {:?} is not an address ({e}; e.g. tcp://127.0.0.1:7000, tls://HOST:PORT, unix:///path, shm://name)",
            line,
            s.get_ref()
        );
        ConfigError::new(Some(key), Some(line), message)
    })
}

/// The secret in the file `secret_file` names (its last line break not part of it).
fn secret(text: &str, path: &Spanned<PathBuf>) -> Result<Secret, ConfigError> {
    let at = line_of(text, path.span().start);
    let error = |why: String| {
        ConfigError::new(
            Some("secret_file"),
            Some(at),
            format!("secret_file at line {at}: {why}"),
        )
    };
    let secret = std::fs::read_to_string(path.get_ref())
        .map_err(|e| error(format!("cannot read {}: {e}", path.get_ref().display())))?;
    Secret::new(secret.trim_end_matches(['\r', '\n']).as_bytes()).map_err(|e| error(e.to_string()))
}

/// The `[tls]` table: the node's certificate, key and authorities, read from their files.
fn tls(text: &str, table: &Spanned<TlsFiles>) -> Result<crate::link::tls::TlsConfig, ConfigError> {
    let at = line_of(text, table.span().start);
    let t = table.get_ref();
    crate::link::tls::TlsConfig::from_pem_files(&t.cert, &t.key, &t.ca).map_err(|e| {
        let message = format!("[tls] at line {at}: {e}");
        ConfigError::new(Some("[tls]"), Some(at), message)
    })
}

/// The `[etcd]` table, validated.
fn etcd(
    text: &str,
    table: &Spanned<EtcdTable>,
) -> Result<crate::discovery::etcd_config::EtcdConfig, ConfigError> {
    let at = line_of(text, table.span().start);
    let t = table.get_ref();
    let mut e = crate::discovery::etcd_config::EtcdConfig::new(t.endpoints.clone());
    if let Some(p) = &t.prefix {
        e.prefix = p.clone();
    }
    if let Some(ttl) = t.lease_ttl_secs {
        e.lease_ttl_secs = ttl;
    }
    e.validate().map_err(|why| {
        ConfigError::new(
            Some("[etcd]"),
            Some(at),
            format!("[etcd] at line {at}: {why}"),
        )
    })?;
    Ok(e)
}

/// The `[[group_permissions]]` rules, validated.
fn group_permissions(
    text: &str,
    rules: &[Spanned<RuleTable>],
) -> Result<crate::GroupPermissions, ConfigError> {
    let mut p = crate::GroupPermissions::default();
    for r in rules {
        let t = r.get_ref();
        p.rules.push(crate::GroupRule {
            ids: (BusId(t.ids[0]), BusId(t.ids[1])),
            join: t.join.clone().unwrap_or_default(),
            publish: t.publish.clone().unwrap_or_default(),
        });
    }
    p.validate().map_err(|why| {
        let at = rules.first().map_or(0, |r| line_of(text, r.span().start));
        let message = format!("[[group_permissions]] (from line {at}): {why}");
        ConfigError::new(Some("[[group_permissions]]"), Some(at), message)
    })?;
    Ok(p)
}

impl NodeConfig {
    /// A configuration read from TOML `text` (see `docs/busway.toml`): each key sets the
    /// `NodeConfig` field of its name (`secret_file` the secret, `[tls]` its PEM files,
    /// `io_threads = 0` the caller's runtime), the rest keep `NodeConfig::new`'s defaults.
    /// `id` may be left to the caller (then 0 until set). The error names the key, its line
    /// and what is allowed; the result has passed `validate` when `id` was given.
    pub fn from_toml(text: &str) -> Result<NodeConfig, ConfigError> {
        let f: FileConfig = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start));
            ConfigError::new(None, line, e.to_string().trim().to_owned())
        })?;
        let mut c = NodeConfig::new(BusId(f.id.unwrap_or(0)));
        let addrs =
            |key: &str, list: &Option<Vec<Spanned<String>>>| -> Result<Vec<Addr>, ConfigError> {
                list.iter().flatten().map(|s| addr(text, key, s)).collect()
            };
        c.listen = addrs("listen", &f.listen)?;
        c.connect = addrs("connect", &f.connect)?;
        c.upstream = f
            .upstream
            .as_ref()
            .map(|s| addr(text, "upstream", s))
            .transpose()?;
        c.subtree = f.subtree.map(|[a, b]| (BusId(a), BusId(b)));
        macro_rules! set {
            ($($field:ident),*) => {$(
                if let Some(v) = f.$field {
                    c.$field = v;
                }
            )*};
        }
        set!(
            ttl,
            relay_grace_ms,
            direct_links,
            shm_channels,
            mem_channels,
            group_logs,
            shm_spins,
            shm_ring_bytes,
            frame_body_max,
            send_queue_bytes_max,
            inbox_bytes_max,
            connections_max,
            handshake_timeout_ms,
            linger_ms,
            heartbeat_interval_ms,
            peer_dead_after_ms,
            forget_after_ms,
            dial_backoff_min_ms,
            clock_skew_max_ms,
            group_retain_bytes
        );
        if let Some(n) = f.io_threads {
            c.io_threads = if n == 0 {
                IoThreads::Current
            } else {
                IoThreads::Dedicated(n)
            };
        }
        c.secret = f
            .secret_file
            .as_ref()
            .map(|p| secret(text, p))
            .transpose()?;
        c.tls = f.tls.as_ref().map(|t| tls(text, t)).transpose()?;
        c.etcd = f.etcd.as_ref().map(|e| etcd(text, e)).transpose()?;
        c.group_permissions = f
            .group_permissions
            .as_ref()
            .map(|rules| group_permissions(text, rules))
            .transpose()?;
        if f.id.is_some() {
            c.validate().map_err(|e| located(text, e))?;
        }
        Ok(c)
    }

    /// [`NodeConfig::from_toml`] of the file at `path`; the error names the file too.
    pub fn from_toml_file(path: &std::path::Path) -> Result<NodeConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError::new(None, None, format!("cannot read {}: {e}", path.display()))
        })?;
        NodeConfig::from_toml(&text).map_err(|e| e.within(&path.display().to_string()))
    }
}

/// `validate`'s error (which starts with the setting's name) with the line that sets it.
fn located(text: &str, error: ConfigError) -> ConfigError {
    let key = error.setting().unwrap_or_default().to_owned();
    match line_of_key(text, &key) {
        Some(line) => ConfigError::new(
            Some(&key),
            Some(line),
            format!("{key} at line {line}: {error}"),
        ),
        None => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_sets_its_field_and_the_rest_keep_their_defaults() {
        let c = NodeConfig::from_toml(
            "id = 7\nlisten = [\"tcp://127.0.0.1:0\"]\nupstream = \"unix:///tmp/x.sock\"\n\
             subtree = [7, 9]\nheartbeat_interval_ms = 250\nio_threads = 0\n",
        )
        .unwrap();
        assert_eq!(c.id, BusId(7));
        assert_eq!(c.listen.len(), 1);
        assert!(c.upstream.is_some());
        assert_eq!(c.subtree, Some((BusId(7), BusId(9))));
        assert_eq!(c.heartbeat_interval_ms, 250);
        assert!(matches!(c.io_threads, IoThreads::Current));
        let d = NodeConfig::new(BusId(7));
        assert_eq!(c.linger_ms, d.linger_ms);
        assert_eq!(c.group_retain_bytes, d.group_retain_bytes);
    }

    /// The commented example, `busway config example`.
    const EXAMPLE: &str = include_str!("../../../../docs/busway.toml");

    #[test]
    fn the_example_file_parses_and_states_the_defaults() {
        let c = NodeConfig::from_toml(EXAMPLE).unwrap();
        let d = NodeConfig::new(BusId(1));
        assert_eq!(c.id, BusId(1));
        assert_eq!(
            c.listen,
            vec!["tcp://127.0.0.1:7000".parse::<Addr>().unwrap()]
        );
        assert_eq!((c.connect.len(), c.upstream.is_some()), (0, false));
        let pairs = [
            (u64::from(c.ttl), u64::from(d.ttl), "ttl"),
            (c.relay_grace_ms, d.relay_grace_ms, "relay_grace_ms"),
            (u64::from(c.shm_spins), u64::from(d.shm_spins), "shm_spins"),
            (
                c.shm_ring_bytes as u64,
                d.shm_ring_bytes as u64,
                "shm_ring_bytes",
            ),
            (
                c.frame_body_max as u64,
                d.frame_body_max as u64,
                "frame_body_max",
            ),
            (
                c.send_queue_bytes_max as u64,
                d.send_queue_bytes_max as u64,
                "send_queue_bytes_max",
            ),
            (
                c.inbox_bytes_max as u64,
                d.inbox_bytes_max as u64,
                "inbox_bytes_max",
            ),
            (
                c.connections_max as u64,
                d.connections_max as u64,
                "connections_max",
            ),
            (
                c.handshake_timeout_ms,
                d.handshake_timeout_ms,
                "handshake_timeout_ms",
            ),
            (c.linger_ms, d.linger_ms, "linger_ms"),
            (
                c.heartbeat_interval_ms,
                d.heartbeat_interval_ms,
                "heartbeat_interval_ms",
            ),
            (
                c.peer_dead_after_ms,
                d.peer_dead_after_ms,
                "peer_dead_after_ms",
            ),
            (c.forget_after_ms, d.forget_after_ms, "forget_after_ms"),
            (
                c.dial_backoff_min_ms,
                d.dial_backoff_min_ms,
                "dial_backoff_min_ms",
            ),
            (
                c.clock_skew_max_ms,
                d.clock_skew_max_ms,
                "clock_skew_max_ms",
            ),
            (
                c.group_retain_bytes as u64,
                d.group_retain_bytes as u64,
                "group_retain_bytes",
            ),
        ];
        for (file, default, key) in pairs {
            assert_eq!(
                file, default,
                "docs/busway.toml states {key} = {file}, the default is {default}"
            );
        }
        assert_eq!(
            (c.direct_links, c.shm_channels, c.mem_channels, c.group_logs),
            (d.direct_links, d.shm_channels, d.mem_channels, d.group_logs)
        );
    }

    #[test]
    fn errors_name_the_key_the_line_and_what_is_allowed() {
        let typo = NodeConfig::from_toml("id = 1\nheartbeat_intervl_ms = 5\n").unwrap_err();
        assert_eq!(typo.line(), Some(2), "the line, typed");
        let typo = typo.to_string();
        assert!(typo.contains("line 2"), "{typo}");
        assert!(typo.contains("heartbeat_intervl_ms"), "{typo}");
        assert!(
            typo.contains("heartbeat_interval_ms"),
            "expected keys listed: {typo}"
        );
        let bad_addr = NodeConfig::from_toml("id = 1\nlisten = [\"nowhere\"]\n").unwrap_err();
        assert_eq!(
            (bad_addr.setting(), bad_addr.line()),
            (Some("listen"), Some(2))
        );
        let wrong_type = NodeConfig::from_toml("id = 1\n\nlinger_ms = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            wrong_type.contains("line 3") && wrong_type.contains("linger_ms"),
            "{wrong_type}"
        );
        let bad_addr =
            NodeConfig::from_toml("id = 1\nconnect = [\"tcp://x\", \"carrier-pigeon://7\"]\n")
                .unwrap_err()
                .to_string();
        assert!(bad_addr.starts_with("connect at line 2:"), "{bad_addr}");
        let bad_value = NodeConfig::from_toml("id = 1\n# the ring\nshm_ring_bytes = 1000\n")
            .unwrap_err()
            .to_string();
        assert!(
            bad_value.starts_with("shm_ring_bytes at line 3:")
                && bad_value.contains("power of two"),
            "{bad_value}"
        );
        let no_secret = NodeConfig::from_toml("secret_file = \"/nonexistent/s\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            no_secret.starts_with("secret_file at line 1: cannot read"),
            "{no_secret}"
        );
        let short_lease = NodeConfig::from_toml(
            "id = 1\n\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nlease_ttl_secs = 1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            short_lease.starts_with("[etcd] at line 3: etcd.lease_ttl_secs: 1 (at least 2)"),
            "{short_lease}"
        );
        let etcd_typo = NodeConfig::from_toml("id = 1\n[etcd]\nendpoint = [\"http://h:1\"]\n")
            .unwrap_err()
            .to_string();
        assert!(etcd_typo.contains("endpoint"), "{etcd_typo}");
    }

    fn vars(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn environment_variables_override_the_file_and_name_themselves_when_wrong() {
        // A table at the end (where a key appended after it would land) when it can be read.
        let table = "\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n";
        let file =
            format!("id = 1\nlinger_ms = 100\nlisten = [\n  \"tcp://127.0.0.1:1\",\n]\n{table}");
        let file = file.as_str();
        let c = NodeConfig::from_toml_with_env(
            file,
            vars(&[
                ("BUSWAY_LINGER_MS", "500"),
                ("BUSWAY_LISTEN", "tcp://127.0.0.1:2,unix:///tmp/x.sock"),
                ("BUSWAY_DIRECT_LINKS", "false"),
                ("BUSWAY_SUBTREE", "1,99"),
                ("BUSWAY_LOG", "debug"),
                ("PATH", "/bin"),
            ]),
        )
        .unwrap();
        assert_eq!(c.linger_ms, 500);
        assert_eq!(c.listen.len(), 2);
        assert!(!c.direct_links);
        assert_eq!(c.subtree, Some((BusId(1), BusId(99))));
        assert_eq!(
            c.etcd.is_some(),
            !table.is_empty(),
            "the file's tables stay"
        );
        let c =
            NodeConfig::from_toml_with_env("", vars(&[("BUSWAY_HEARTBEAT_INTERVAL_MS", "250")]))
                .unwrap();
        assert_eq!(c.heartbeat_interval_ms, 250);
        let wrong = NodeConfig::from_toml_with_env(file, vars(&[("BUSWAY_LINGER_MS", "soon")]))
            .unwrap_err()
            .to_string();
        assert!(wrong.starts_with("BUSWAY_LINGER_MS: "), "{wrong}");
        let bad =
            NodeConfig::from_toml_with_env("id = 1\n", vars(&[("BUSWAY_SHM_RING_BYTES", "1000")]))
                .unwrap_err();
        assert_eq!(
            bad.setting(),
            Some("BUSWAY_SHM_RING_BYTES"),
            "the variable, typed"
        );
        assert_eq!(bad.line(), None, "no line the user wrote");
        let bad = bad.to_string();
        assert!(bad.starts_with("BUSWAY_SHM_RING_BYTES: "), "{bad}");
        assert!(bad.contains("power of two"), "{bad}");
        // A setting of the file that a variable made wrong: the file's own line.
        let clash = NodeConfig::from_toml_with_env(
            "id = 1\ninbox_bytes_max = 5000000\n",
            vars(&[("BUSWAY_FRAME_BODY_MAX", "6000000")]),
        )
        .unwrap_err();
        assert_eq!(clash.setting(), Some("inbox_bytes_max"), "{clash}");
        assert_eq!(clash.line(), Some(2), "{clash}");
        assert!(clash.to_string().contains("at line 2"), "{clash}");
        // ... and the variable behind the other setting the error names.
        assert!(
            clash
                .to_string()
                .starts_with("the file with BUSWAY_FRAME_BODY_MAX over it: "),
            "{clash}"
        );
        // A rule between two settings, broken by a variable: the variable is named.
        let window = NodeConfig::from_toml_with_env(
            "id = 1\nforget_after_ms = 60000\n",
            vars(&[("BUSWAY_PEER_DEAD_AFTER_MS", "40000")]),
        )
        .unwrap_err();
        assert_eq!(window.setting(), Some("forget_after_ms"), "{window}");
        assert!(
            window.to_string().contains("BUSWAY_PEER_DEAD_AFTER_MS"),
            "{window}"
        );
        // A mistake in the file still names the file's line.
        let typo = NodeConfig::from_toml_with_env(
            "id = 1\nlingr_ms = 1\n",
            vars(&[("BUSWAY_LINGER_MS", "5")]),
        )
        .unwrap_err()
        .to_string();
        assert!(typo.contains("line 2"), "{typo}");
    }

    #[test]
    fn the_etcd_table_sets_discovery() {
        let c = NodeConfig::from_toml(
            "id = 1\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\", \"http://127.0.0.1:2380\"]\nprefix = \"/game\"\n",
        )
        .unwrap();
        let e = c.etcd.unwrap();
        assert_eq!(e.endpoints.len(), 2);
        assert_eq!((e.prefix.as_str(), e.lease_ttl_secs), ("/game", 10));
        assert!(NodeConfig::from_toml("id = 1\n").unwrap().etcd.is_none());
    }
}
