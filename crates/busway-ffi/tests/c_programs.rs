//! The C ABI from C: `tests/c/ffi_test.c` built against the library (libbusway_ffi.so) under
//! AddressSanitizer (its leak check on) and run, alone and against the `busway` command. A
//! leak, a double release or a use of a released payload fails the run as a failed check does.

mod common;
use common::{have, profile_dir, Proc};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Longest one program may run, under AddressSanitizer on a busy machine.
const RUN_LIMIT: Duration = Duration::from_secs(300);
/// Sequenced messages each way between C and the command.
const COUNT: &str = "1000000";

/// Where cargo put libbusway_ffi.so: the profile folder after `cargo build`, its deps folder
/// after `cargo test` (which does not copy it up). The newer of the two: a copy left in the
/// profile folder by an earlier `cargo build` would otherwise test old code.
fn lib_dir() -> PathBuf {
    let profile = profile_dir();
    let built_at = |d: &PathBuf| {
        let lib = std::fs::metadata(d.join("libbusway_ffi.so")).ok()?;
        lib.modified().ok()
    };
    [profile.clone(), profile.join("deps")]
        .into_iter()
        .filter_map(|d| Some((built_at(&d)?, d)))
        .max_by_key(|(at, _)| *at)
        .map(|(_, d)| d)
        .unwrap_or_else(|| panic!("no libbusway_ffi.so in {} or its deps", profile.display()))
}

/// The C test program, built once per run.
fn program() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let lib_dir = lib_dir();
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ffi_test");
        let built = Command::new("cc")
            .args(["-std=gnu11", "-O1", "-g", "-Wall", "-Wextra", "-Werror"])
            .args(["-fsanitize=address,undefined", "-fno-omit-frame-pointer"])
            .arg("-I")
            .arg(crate_dir.join("include"))
            .arg(crate_dir.join("tests/c/ffi_test.c"))
            .arg("-o")
            .arg(&out)
            .arg("-L")
            .arg(&lib_dir)
            .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
            .args(["-lbusway_ffi", "-lpthread"])
            .output()
            .expect("cc runs (apt-get install gcc)");
        assert!(
            built.status.success(),
            "cc failed:\n{}",
            String::from_utf8_lossy(&built.stderr)
        );
        out
    })
}

/// The `busway` command of the same build.
fn busway_bin() -> PathBuf {
    let bin = profile_dir().join("busway");
    assert!(
        bin.exists(),
        "{} is missing: run the workspace's tests (`cargo test --release --workspace`) or build it (`cargo build --release -p busway-cli`)",
        bin.display()
    );
    bin
}

/// The sanitizers' settings: every error and leak fails the run.
fn sanitized(cmd: &mut Command) -> &mut Command {
    cmd.env(
        "ASAN_OPTIONS",
        "detect_leaks=1:abort_on_error=0:exitcode=86",
    )
    .env("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
}

/// Waits for `p` within `RUN_LIMIT`: its output, or a failure naming what it said.
fn finish(mut p: Proc, what: &str) -> Output {
    let start = Instant::now();
    loop {
        if p.0.try_wait().expect("wait").is_some() {
            let mut out = Vec::new();
            let mut err = Vec::new();
            if let Some(mut o) = p.0.stdout.take() {
                let _ = o.read_to_end(&mut out);
            }
            if let Some(mut e) = p.0.stderr.take() {
                let _ = e.read_to_end(&mut err);
            }
            let status = p.0.wait().expect("wait");
            return Output {
                status,
                stdout: out,
                stderr: err,
            };
        }
        assert!(
            start.elapsed() < RUN_LIMIT,
            "{what} did not finish within {RUN_LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_ok(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Starts a program that prints "listening on ADDR" first; returns it and the address.
fn listening(mut cmd: Command) -> (Proc, String, BufReader<std::process::ChildStdout>) {
    let mut p = Proc(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts"),
    );
    let mut out = BufReader::new(p.0.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("its first line");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    (p, addr, out)
}

#[test]
fn c_nodes_exchange_a_million_each_way_call_publish_and_come_back_with_no_leak() {
    if !have(&["cc"]) {
        return;
    }
    let mut cmd = Command::new(program());
    sanitized(&mut cmd).arg("self");
    let p = Proc(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts"),
    );
    let out = finish(p, "ffi_test self");
    let said = assert_ok(&out, "ffi_test self");
    for line in [
        "1,000,000 verified messages each way",
        "calls: 1 blocking, 100 in flight, 1 to nobody",
        "a group and a multicast",
        "bad input named",
        "a peer stopped and back",
        "ok",
    ] {
        assert!(
            said.lines().any(|l| l == line),
            "{line:?} missing from:\n{said}"
        );
    }
}

#[test]
fn a_c_sender_reaches_busway_listen_verify_with_a_million_in_order() {
    if !have(&["cc"]) {
        return;
    }
    let mut listen = Command::new(busway_bin());
    listen.args([
        "listen",
        "--id",
        "1",
        "--listen",
        "tcp://127.0.0.1:0",
        "--count",
        COUNT,
        "--verify",
    ]);
    let (listener, addr, rest) = listening(listen);
    let mut cmd = Command::new(program());
    sanitized(&mut cmd).args(["send", &addr, "5", "1", COUNT]);
    let sender = Proc(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts"),
    );
    assert_ok(&finish(sender, "ffi_test send"), "ffi_test send");
    let mut listener = listener;
    listener.0.stdout = Some(rest.into_inner());
    let said = assert_ok(&finish(listener, "busway listen"), "busway listen --verify");
    assert!(
        said.contains("received 1000000, missing 0, duplicates 0, out-of-order 0"),
        "{said}"
    );
}

#[test]
fn busway_send_and_call_reach_a_c_server() {
    if !have(&["cc"]) {
        return;
    }
    let mut cmd = Command::new(program());
    sanitized(&mut cmd).args(["serve", "7", COUNT]);
    let (server, addr, rest) = listening(cmd);
    let call = Command::new(busway_bin())
        .args([
            "call",
            "--id",
            "8",
            "--connect",
            &addr,
            "--to",
            "7",
            "ping from the command",
        ])
        .output()
        .expect("busway call runs");
    let answer = assert_ok(&call, "busway call");
    assert!(answer.contains("ping from the command"), "{answer}");
    let send = Command::new(busway_bin())
        .args([
            "send",
            "--id",
            "9",
            "--connect",
            &addr,
            "--to",
            "7",
            "--count",
            COUNT,
            "--size",
            "16",
        ])
        .output()
        .expect("busway send runs");
    assert_ok(&send, "busway send");
    let mut server = server;
    server.0.stdout = Some(rest.into_inner());
    let said = assert_ok(&finish(server, "ffi_test serve"), "ffi_test serve");
    assert!(
        said.contains(&format!("received {COUNT} in order, answered 1 requests")),
        "{said}"
    );
}
