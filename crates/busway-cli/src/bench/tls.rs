//! Certificates for the tls4 row: one authority and a certificate per bench node (sender and
//! receiver), made once per `busway bench` run into a directory of its own, which workers read
//! with `--tls-dir` (`ID.pem`, `ID.key`, `ca.pem`).

use crate::cert::{Authority, Subject, CA_VALID_DAYS, NODE_VALID_DAYS};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The bus ids the bench's nodes take (see `worker`).
const BENCH_NODE_IDS: [u64; 2] = [1, 2];

/// The directory with the run's certificates, made at the first call.
pub(super) fn certificates() -> Result<PathBuf, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("busway-bench-tls-{}", std::process::id()));
        make(&dir).map_err(|e| {
            format!(
                "cannot make the tls4 certificates in {}: {e}",
                dir.display()
            )
        })?;
        Ok(dir)
    })
    .clone()
}

/// The certificates of `busway cert ca` and `busway cert node` (the keys' modes do not
/// matter here: a run's own directory, removed at its end).
fn make(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let (ca, _) = Authority::generate(CA_VALID_DAYS)?;
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).map_err(|e| format!("{name}: {e}"))
    };
    write("ca.pem", ca.cert_pem())?;
    for id in BENCH_NODE_IDS {
        let issued = ca.issue(Subject::Node(id), NODE_VALID_DAYS)?;
        write(&format!("{id}.pem"), &issued.cert_pem)?;
        write(&format!("{id}.key"), &issued.key_pem)?;
    }
    Ok(())
}

/// Removes the run's certificates, if they were made.
pub(super) fn remove_certificates() {
    let dir = std::env::temp_dir().join(format!("busway-bench-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(dir);
}

/// The TLS configuration of bench node `id` from `dir`.
pub(super) fn node_tls(dir: &Path, id: u64) -> Result<busway::TlsConfig, String> {
    busway::TlsConfig::from_pem_files(
        &dir.join(format!("{id}.pem")),
        &dir.join(format!("{id}.key")),
        &dir.join("ca.pem"),
    )
    .map_err(String::from)
}
