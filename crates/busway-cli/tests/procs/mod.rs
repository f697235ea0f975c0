//! The process tests' shared helpers: `busway` started as a child that dies with the test,
//! its first line read, its end awaited within a bound, a free port.

#![allow(dead_code)] // Each test binary uses its own part of these.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_busway");

/// How long a killed process's output may take to be read, for the panic that shows it.
const KILLED_OUTPUT_WAIT: Duration = Duration::from_secs(10);

/// A child process killed when the test ends, pass or fail.
pub(crate) struct Proc(pub(crate) Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `busway ARGS`, started in `dir` (or here), stdout and stderr piped.
pub(crate) fn spawn_in(dir: Option<&Path>, args: &[&str]) -> Proc {
    let mut cmd = Command::new(BIN);
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    Proc(cmd.spawn().expect("busway starts"))
}

/// Starts `busway listen ...` in `dir` (or here) and returns it with the address it printed.
pub(crate) fn listener_in(
    dir: Option<&Path>,
    args: &[&str],
) -> (Proc, String, BufReader<ChildStdout>) {
    let mut p = spawn_in(dir, args);
    let mut out = BufReader::new(p.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    (p, addr, out)
}

/// Waits for the process within `limit`, with the rest of a stdout or stderr the test already
/// read from; returns (exit success, exit code, stdout, stderr). A process still running at
/// `limit` is killed and fails the test with what it said.
pub(crate) fn finish_within(
    mut p: Proc,
    out: Option<BufReader<ChildStdout>>,
    err: Option<BufReader<ChildStderr>>,
    limit: Duration,
) -> (bool, Option<i32>, String, String) {
    let (tx, rx) = mpsc::channel();
    let mut stdout = out
        .map(|o| Box::new(o) as Box<dyn Read + Send>)
        .unwrap_or_else(|| Box::new(p.0.stdout.take().unwrap()));
    let mut stderr = err
        .map(|e| Box::new(e) as Box<dyn Read + Send>)
        .unwrap_or_else(|| Box::new(p.0.stderr.take().unwrap()));
    std::thread::spawn(move || {
        let mut o = String::new();
        let mut e = String::new();
        let _ = stdout.read_to_string(&mut o);
        let _ = stderr.read_to_string(&mut e);
        let _ = tx.send((o, e));
    });
    let (o, e) = match rx.recv_timeout(limit) {
        Ok(out) => out,
        Err(_) => {
            // Stopped, so that what it said shows why it did not finish.
            let _ = p.0.kill();
            let (o, e) = rx.recv_timeout(KILLED_OUTPUT_WAIT).unwrap_or_default();
            panic!("command did not finish within {limit:?}; stdout: {o}\nstderr: {e}");
        }
    };
    let status = p.0.wait().unwrap();
    (status.success(), status.code(), o, e)
}

/// A port free right now on 127.0.0.1.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
