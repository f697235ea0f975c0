//! The C++ lobby example (examples/cpp) as its README section builds it, with CMake from
//! cargo's target folder, run against the `busway` command: a request answered, an arrival
//! published to a room's group, a peer's end seen, a clean stop on SIGTERM.

mod common;
use common::{have, profile_dir, Proc};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Longest a line of the lobby may take to come.
const LINE_WAIT: Duration = Duration::from_secs(60);

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what} does not run: {e}"));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    said
}

/// The lobby's stdout lines, read on a thread, with a bounded wait for each.
struct Lines(mpsc::Receiver<String>);

impl Lines {
    fn of(out: ChildStdout) -> Self {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self(rx)
    }

    /// Waits for a line that `wanted` accepts; panics naming what came instead.
    fn until(&self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let mut seen = Vec::new();
        loop {
            match self.0.recv_timeout(LINE_WAIT) {
                Ok(line) if wanted(&line) => return line,
                Ok(line) => seen.push(line),
                Err(_) => panic!("no line {what} within {LINE_WAIT:?}; saw {seen:?}"),
            }
        }
    }
}

#[test]
fn the_cpp_lobby_serves_publishes_sees_a_peer_go_and_stops_on_sigterm() {
    if !have(&["cmake", "c++"]) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let profile = profile_dir();
    let build = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cpp-lobby");
    let target = profile.parent().expect("target folder");
    let profile_name = profile
        .file_name()
        .and_then(|n| n.to_str())
        .expect("profile name");
    run(
        Command::new("cmake")
            .arg("-S")
            .arg(root.join("examples/cpp"))
            .arg("-B")
            .arg(&build)
            .arg(format!("-DBUSWAY_PROFILE={profile_name}"))
            .env("CARGO_TARGET_DIR", target),
        "cmake (configure)",
    );
    run(
        Command::new("cmake").arg("--build").arg(&build),
        "cmake --build",
    );
    let busway = profile.join("busway");
    assert!(
        busway.exists(),
        "{} is missing: run the workspace's tests",
        busway.display()
    );

    let mut lobby = Proc(
        Command::new(build.join("lobby"))
            .args(["1", "tcp://127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("the lobby starts"),
    );
    let lines = Lines::of(lobby.0.stdout.take().expect("stdout"));
    let first = lines.until("listening on", |l| l.starts_with("listening on "));
    let addr = first.trim_start_matches("listening on ").to_owned();

    // A member of room 3's group, behind the command.
    let mut member = Proc(
        Command::new(&busway)
            .args([
                "listen",
                "--id",
                "21",
                "--connect",
                &addr,
                "--group",
                "room-3",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("busway listen starts"),
    );
    let member_lines = Lines::of(member.0.stdout.take().expect("stdout"));
    member_lines.until("joined group room-3", |l| l == "joined group room-3");
    lines.until("peer 21 up", |l| l == "peer 21 up");

    // A request answered; the arrival reaches the room's member (publish until it is known).
    let answer = run(
        Command::new(&busway).args([
            "call",
            "--id",
            "22",
            "--connect",
            &addr,
            "--to",
            "1",
            "enter 3 ann",
        ]),
        "busway call",
    );
    assert!(answer.contains("welcome ann to 3"), "{answer}");
    let mut published = None;
    for _ in 0..20 {
        let _ = run(
            Command::new(&busway).args([
                "call",
                "--id",
                "22",
                "--connect",
                &addr,
                "--to",
                "1",
                "enter 3 bob",
            ]),
            "busway call",
        );
        if let Ok(line) = member_lines.0.recv_timeout(Duration::from_millis(500)) {
            published = Some(line);
            break;
        }
    }
    let published = published.expect("an arrival reached the room's member");
    assert!(published.contains("entered"), "{published}");

    // The member goes away: the lobby says so.
    let _ = member.0.kill();
    let _ = member.0.wait();
    lines.until("peer 21 down", |l| l.starts_with("peer 21 down"));

    // SIGTERM: a clean stop, exit 0.
    let pid = lobby.0.id().to_string();
    run(Command::new("kill").args(["-TERM", &pid]), "kill -TERM");
    lines.until("stopping", |l| l == "stopping");
    let status = lobby.0.wait().expect("the lobby ends");
    assert!(status.success(), "the lobby exited with {status}");
}
