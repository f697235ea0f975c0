//! `busway cert` end to end (issue #28, point 9): certificates it makes carry messages with the
//! README's flags as written, and certificate mistakes are named with what to do.

use std::io::BufReader;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The process tests' shared helpers.
mod procs;
use procs::{free_port, Proc};

/// Longest a whole command may run in these tests.
const LIMIT: Duration = Duration::from_secs(60);
/// What `busway cert` gives a key file: its owner's only.
const KEY_MODE: u32 = 0o600;

/// A directory of its own for a test, removed when the test ends.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("busway-cert-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `busway ARGS` started in `dir`.
fn spawn_in(dir: &Path, args: &[&str]) -> Proc {
    procs::spawn_in(Some(dir), args)
}

/// Starts `busway listen ...` in `dir` and returns it with the address it printed.
fn listener(dir: &Path, args: &[&str]) -> (Proc, String, BufReader<std::process::ChildStdout>) {
    procs::listener_in(Some(dir), args)
}

/// Waits for the process within `LIMIT`; returns (exit success, stdout, stderr).
fn finish(p: Proc, out: Option<BufReader<std::process::ChildStdout>>) -> (bool, String, String) {
    let (ok, _, o, e) = procs::finish_within(p, out, None, LIMIT);
    (ok, o, e)
}

/// `busway ARGS` run in `dir` to its end: (success, stdout, stderr).
fn run_in(dir: &Path, args: &[&str]) -> (bool, String, String) {
    finish(spawn_in(dir, args), None)
}

/// `busway ARGS` run in `dir`, which must succeed; its stdout.
fn ok_in(dir: &Path, args: &[&str]) -> String {
    let (ok, out, err) = run_in(dir, args);
    assert!(ok, "busway {args:?} failed: {out}{err}");
    out
}

/// `busway ARGS` run in `dir`, which must fail; its stderr.
fn fails_in(dir: &Path, args: &[&str]) -> String {
    let (ok, out, err) = run_in(dir, args);
    assert!(!ok, "busway {args:?} succeeded: {out}{err}");
    err
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// `busway listen --id ID` on tls:// in `dir` with `ID_FILE`'s certificate, `busway send --id
/// 2` to it with 2.pem, and the text received.
fn send_over_tls(dir: &Path, id: &str, cert: &str) -> String {
    let (cert_pem, cert_key) = (format!("{cert}.pem"), format!("{cert}.key"));
    let (l, addr, out) = listener(
        dir,
        &[
            "listen",
            "--id",
            id,
            "--listen",
            "tls://127.0.0.1:0",
            "--tls-cert",
            &cert_pem,
            "--tls-key",
            &cert_key,
            "--tls-ca",
            "ca.pem",
            "--count",
            "1",
        ],
    );
    ok_in(
        dir,
        &[
            "send",
            "--id",
            "2",
            "--connect",
            &addr,
            "--tls-cert",
            "2.pem",
            "--tls-key",
            "2.key",
            "--tls-ca",
            "ca.pem",
            "--to",
            id,
            "over tls",
        ],
    );
    let (ok, stdout, err) = finish(l, Some(out));
    assert!(ok, "{err}");
    stdout
}

#[test]
fn certificates_busway_cert_made_carry_a_message_with_the_readmes_flags() {
    let dir = TempDir::new("readme");
    let out = ok_in(&dir.0, &["cert", "ca"]);
    assert!(
        out.starts_with("wrote ./ca.pem: certificate authority")
            && out.contains("\nwrote ./ca.key: its private key"),
        "one line per file: {out}"
    );
    assert_eq!(out.lines().count(), 2, "{out}");
    for id in ["1", "2"] {
        let out = ok_in(&dir.0, &["cert", "node", "--id", id]);
        assert!(
            out.starts_with(&format!("wrote ./{id}.pem: certificate of bus id {id} (DNS:{id}.id.busway), signed by ./ca.pem"))
                && out.contains(&format!("\nwrote ./{id}.key: its private key")),
            "{out}"
        );
    }
    for key in ["ca.key", "1.key", "2.key"] {
        assert_eq!(mode(&dir.file(key)), KEY_MODE, "{key}");
    }
    // As the README writes it, on a port of the test's choosing.
    let at = format!("tls://127.0.0.1:{}", free_port());
    let readme_flags = [
        "--tls-cert",
        "1.pem",
        "--tls-key",
        "1.key",
        "--tls-ca",
        "ca.pem",
    ];
    let mut largs = vec!["listen", "--id", "1", "--listen", &at];
    largs.extend(readme_flags);
    largs.extend(["--count", "1"]);
    let (l, addr, out) = listener(&dir.0, &largs);
    assert_eq!(addr, at);
    ok_in(
        &dir.0,
        &[
            "send",
            "--id",
            "2",
            "--connect",
            &at,
            "--tls-cert",
            "2.pem",
            "--tls-key",
            "2.key",
            "--tls-ca",
            "ca.pem",
            "--to",
            "1",
            "hello",
        ],
    );
    let (ok, stdout, err) = finish(l, Some(out));
    assert!(ok, "{err}");
    assert_eq!(stdout.trim(), "2: hello");
    // A second authority would make every certificate untrusted: refused, naming the file.
    let ca = std::fs::read(dir.file("ca.pem")).unwrap();
    let err = fails_in(&dir.0, &["cert", "ca"]);
    assert!(
        err.contains("refusing to overwrite ./ca.pem") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read(dir.file("ca.pem")).unwrap(), ca, "untouched");
    // --force replaces a key as a new file of its mode, even over one others could read.
    std::fs::set_permissions(dir.file("1.key"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let key = std::fs::read(dir.file("1.key")).unwrap();
    let err = fails_in(&dir.0, &["cert", "node", "--id", "1"]);
    assert!(err.contains("refusing to overwrite ./1.pem"), "{err}");
    ok_in(&dir.0, &["cert", "node", "--id", "1", "--force"]);
    assert_ne!(std::fs::read(dir.file("1.key")).unwrap(), key, "a new key");
    assert_eq!(mode(&dir.file("1.key")), KEY_MODE);
}

#[test]
fn a_relay_certificate_serves_a_node_of_an_id_in_its_range() {
    let dir = TempDir::new("relay");
    ok_in(&dir.0, &["cert", "ca"]);
    let out = ok_in(&dir.0, &["cert", "relay", "--ids", "10-19"]);
    assert!(
        out.starts_with("wrote ./10-19.pem: certificate of bus ids 10-19 (DNS:10-19.ids.busway)"),
        "{out}"
    );
    assert_eq!(mode(&dir.file("10-19.key")), KEY_MODE);
    ok_in(&dir.0, &["cert", "node", "--id", "2"]);
    assert_eq!(send_over_tls(&dir.0, "15", "10-19").trim(), "2: over tls");
    // An id out of the range: refused before the node starts, naming the command to run.
    let err = fails_in(
        &dir.0,
        &[
            "listen",
            "--id",
            "20",
            "--listen",
            "tls://127.0.0.1:0",
            "--tls-cert",
            "10-19.pem",
            "--tls-key",
            "10-19.key",
            "--tls-ca",
            "ca.pem",
        ],
    );
    assert!(
        err.contains("names bus ids 10-19 but not its own id 20")
            && err.contains("busway cert node --id 20"),
        "{err}"
    );
}

#[test]
fn a_certificate_of_another_id_is_refused_naming_the_mismatch_and_the_fix() {
    let dir = TempDir::new("other-id");
    ok_in(&dir.0, &["cert", "ca"]);
    ok_in(&dir.0, &["cert", "node", "--id", "3"]);
    let at = format!("tls://127.0.0.1:{}", free_port());
    let err = fails_in(
        &dir.0,
        &[
            "send",
            "--id",
            "2",
            "--connect",
            &at,
            "--tls-cert",
            "3.pem",
            "--tls-key",
            "3.key",
            "--tls-ca",
            "ca.pem",
            "--to",
            "1",
            "x",
        ],
    );
    assert!(
        err.contains("this node's TLS certificate names bus ids 3 but not its own id 2")
            && err.contains("make one for it with `busway cert node --id 2`"),
        "{err}"
    );
}

#[test]
fn a_certificate_of_another_authority_names_the_unknown_authority_at_both_ends() {
    let dir = TempDir::new("other-ca");
    ok_in(&dir.0, &["cert", "ca"]);
    ok_in(&dir.0, &["cert", "node", "--id", "1"]);
    let other = dir.file("other");
    ok_in(&dir.0, &["cert", "ca", "--dir", "other"]);
    ok_in(&dir.0, &["cert", "node", "--id", "2", "--dir", "other"]);
    let (_l, addr, _out) = listener(
        &dir.0,
        &[
            "listen",
            "--id",
            "1",
            "--listen",
            "tls://127.0.0.1:0",
            "--tls-cert",
            "1.pem",
            "--tls-key",
            "1.key",
            "--tls-ca",
            "ca.pem",
        ],
    );
    let send = |ca: &str| {
        fails_in(
            &other,
            &[
                "send",
                "--id",
                "2",
                "--connect",
                &addr,
                "--tls-cert",
                "2.pem",
                "--tls-key",
                "2.key",
                "--tls-ca",
                ca,
                "--to",
                "1",
                "x",
            ],
        )
    };
    // Node 2 trusts its own authority only: the listener's certificate is a stranger's.
    let err = send("ca.pem");
    assert!(
        err.contains(
            "the peer's certificate is not signed by an authority this node trusts (UnknownIssuer)"
        ),
        "{err}"
    );
    // Node 2 trusts the listener's authority, which does not trust node 2's: the listener's
    // refusal, told by its alert.
    let err = send("../ca.pem");
    assert!(
        err.contains("the peer does not trust the authority that signed this node's certificate (alert UnknownCA)"),
        "{err}"
    );
}

#[test]
fn the_openssl_v1_certificate_of_the_issue_is_named_with_the_fix() {
    let v1 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tls-openssl-v1");
    let err = fails_in(
        &v1,
        &[
            "node",
            "--id",
            "1",
            "--listen",
            "tls://127.0.0.1:0",
            "--tls-cert",
            "1.pem",
            "--tls-key",
            "1.key",
            "--tls-ca",
            "ca.pem",
        ],
    );
    assert!(
        err.contains("certificate chain 1.pem: this node's certificate is an X.509 v1 certificate")
            && err.contains("-copy_extensions copy")
            && err.contains("busway cert node --id ID"),
        "{err}"
    );
}

#[test]
fn tls_with_no_certificate_names_the_flags_and_busway_cert() {
    let dir = TempDir::new("no-flags");
    let err = fails_in(
        &dir.0,
        &["node", "--id", "1", "--listen", "tls://127.0.0.1:0"],
    );
    assert!(
        err.contains("tls://127.0.0.1:0 needs TLS")
            && err.contains("--tls-cert FILE --tls-key FILE --tls-ca FILE")
            && err.contains("`busway cert ca` then `busway cert node --id 1`"),
        "{err}"
    );
    assert!(!err.contains("NodeConfig"), "no library field: {err}");
}

#[test]
fn signing_mistakes_are_named_and_nothing_is_written() {
    let dir = TempDir::new("mistakes");
    // No authority yet.
    let err = fails_in(&dir.0, &["cert", "node", "--id", "1"]);
    assert!(
        err.contains("cannot read ./ca.pem") && err.contains("make it first with `busway cert ca`"),
        "{err}"
    );
    // ca.key of another authority beside ca.pem.
    ok_in(&dir.0, &["cert", "ca"]);
    ok_in(&dir.0, &["cert", "ca", "--dir", "other"]);
    std::fs::copy(dir.file("other/ca.key"), dir.file("ca.key")).unwrap();
    let err = fails_in(&dir.0, &["cert", "node", "--id", "1"]);
    assert!(err.contains("its key is not the authority's key"), "{err}");
    assert!(!dir.file("1.pem").exists() && !dir.file("1.key").exists());
    // Arguments.
    let err = fails_in(&dir.0, &["cert", "relay", "--ids", "19-10"]);
    assert!(err.contains("FIRST is above LAST"), "{err}");
    let err = fails_in(&dir.0, &["cert", "ca", "--days", "0", "--dir", "zero"]);
    assert!(err.contains("--days"), "{err}");
}
