//! Every command line of the README's "The command" section, run as written, in order, so
//! that the front door cannot drift from what the binary does. The rules that make the lines
//! runnable here, and nothing else:
//!
//! * **Ports**: each port the README shows (7000, 7070, 7100, 7443) is a free port, the same
//!   one wherever the README repeats it; etcd's 2379 is the test's own etcd. A `busway node`
//!   line after the first (the hub, which runs to the end) gets fresh ports of its own: it is
//!   a variant of the hub's line, started, seen listening, stopped with SIGTERM (exit 0).
//! * **Paths**: the lines run in a temporary directory; `/tmp/b.sock` and
//!   `/etc/busway/secret` are files in it, the secret made first (32 hex digits); a file a
//!   line writes (`> busway.toml`) gets the hub's port replaced by a fresh one, as the line
//!   after it would take the hub's port otherwise; `shm://lobby` gets the test's pid.
//! * **Placeholders**: `[...]` (options shown as optional) is left out.
//! * **Long lines**: `--count 1000000` and `--count 100000` send 1,000; every `bench` runs
//!   for 0.1 s a round on one transport (`--transports tcp4` where the line names none),
//!   with one session, receiver, concurrency or idle count, and 200 round trips.
//! * **etcd**: the hub registers in etcd (`--etcd`), as the line that finds it there by id
//!   needs; without etcd installed (and `CI` unset) the etcd lines are skipped, saying so.
//! * `busway listen` lines run in the background until the end (ready once they print
//!   where they listen, or their upstream is up); every other line must exit 0 within
//!   `LIMIT`; `curl URL` is an HTTP GET that must answer 200.

use super::etcd::Etcd;
use super::*;
use std::collections::HashMap;

/// The ports the README shows for the hub and its peers.
const README_PORTS: [&str; 4] = ["7000", "7070", "7100", "7443"];
/// etcd's port in the README.
const README_ETCD: &str = "http://127.0.0.1:2379";

/// The command lines of the README's "The command" section (comments and blank lines out).
fn readme_lines() -> Vec<String> {
    let readme = include_str!("../../../../README.md");
    let section = &readme[readme.find("## The command").expect("the section")..];
    let start = section.find("```sh\n").expect("its block") + "```sh\n".len();
    let end = start + section[start..].find("```").expect("the block's end");
    section[start..end]
        .lines()
        .map(|l| {
            // A comment ends the line where ` #` starts outside quotes.
            let mut quoted = false;
            let mut cut = l.len();
            for (i, c) in l.char_indices() {
                match c {
                    '"' => quoted = !quoted,
                    '#' if !quoted && (i == 0 || l[..i].ends_with(' ')) => {
                        cut = i;
                        break;
                    }
                    _ => {}
                }
            }
            l[..cut].trim().to_owned()
        })
        .filter(|l| !l.is_empty())
        .collect()
}

/// Splits a command into words as a shell would for these lines: spaces, double quotes,
/// `[...]` groups left out.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut word, mut quoted, mut optional, mut any) = (String::new(), false, 0, false);
    for c in line.chars() {
        match c {
            '"' if optional == 0 => {
                quoted = !quoted;
                any = true;
            }
            '[' if !quoted => optional += 1,
            ']' if !quoted => optional -= 1,
            ' ' if !quoted => {
                if any && optional == 0 {
                    out.push(std::mem::take(&mut word));
                }
                word.clear();
                any = false;
            }
            c if optional == 0 => {
                word.push(c);
                any = true;
            }
            _ => {}
        }
    }
    if any && optional == 0 {
        out.push(word);
    }
    out
}

/// The state of one run through the README.
struct Readme {
    dir: std::path::PathBuf,
    ports: HashMap<String, String>,
    etcd: Option<Etcd>,
    background: Vec<Proc>,
    /// What the background processes print, read to the end (a closed pipe would fail their
    /// next line).
    outputs: Vec<mpsc::Receiver<String>>,
    hub_started: bool,
}

impl Readme {
    /// `word` with the README's ports, paths and etcd replaced; `fresh` gives a node line
    /// other than the hub's ports of its own.
    fn substitute(&mut self, word: &str, fresh: bool) -> String {
        let mut w = word.replace("/tmp/b.sock", &self.path("b.sock"));
        w = w.replace("/etc/busway/secret", &self.path("secret"));
        w = w.replace(
            "shm://lobby",
            &format!("shm://lobby-{}", std::process::id()),
        );
        if let Some(etcd) = &self.etcd {
            w = w.replace(README_ETCD, &etcd.url());
        }
        for p in README_PORTS {
            let shown = format!(":{p}");
            let Some(at) = w.find(&shown) else { continue };
            let rest = &w[at + shown.len()..];
            if !(rest.is_empty() || rest.starts_with('/')) {
                continue;
            }
            let port = if fresh {
                free_port().to_string()
            } else {
                self.ports
                    .entry(p.to_owned())
                    .or_insert_with(|| free_port().to_string())
                    .clone()
            };
            w = format!("{}:{port}{rest}", &w[..at]);
        }
        w
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// The words of a `busway` line made short where the README's are long (see the rules).
    fn shorten(words: &mut Vec<String>) {
        for i in 0..words.len().saturating_sub(1) {
            if words[i] == "--count" && ["1000000", "100000"].contains(&words[i + 1].as_str()) {
                words[i + 1] = "1000".into();
            }
            if words[i] == "--idle" {
                words[i + 1] = "10".into();
            }
        }
        if words.first().map(String::as_str) != Some("bench") {
            return;
        }
        let has = |w: &[String], flag: &str| w.iter().any(|x| x == flag);
        let mut extra: Vec<&str> = vec!["--duration", "0.1", "--rounds", "1"];
        if !has(words, "--transports") && !has(words, "--broadcast") && !has(words, "--idle") {
            extra.extend(["--transports", "tcp4"]);
        }
        for (workload, flag, value) in [
            ("--latency", "--round-trips", "200"),
            ("--rpc", "--concurrency", "1"),
            ("--pingpong", "--sessions", "1"),
            ("--broadcast", "--receivers", "1"),
        ] {
            if has(words, workload) && !has(words, flag) {
                extra.extend([flag, value]);
            }
        }
        if has(words, "--broadcast") {
            extra.extend(["--transports", "mem"]);
        }
        if has(words, "--idle") {
            extra.clear();
        }
        words.extend(extra.into_iter().map(String::from));
    }

    /// Runs one command of a line (`&&` already split); panics naming the line if it fails.
    fn run(&mut self, line: &str, command: &str) {
        let mut ws = words(command);
        let mut env = Vec::new();
        while ws
            .first()
            .is_some_and(|w| w.contains('=') && !w.starts_with('-'))
        {
            let w = ws.remove(0);
            let (k, v) = w.split_once('=').unwrap();
            env.push((k.to_owned(), v.to_owned()));
        }
        let program = ws.remove(0);
        let is_node = ws.first().map(String::as_str) == Some("node");
        let fresh = is_node && self.hub_started;
        let mut ws: Vec<String> = ws.iter().map(|w| self.substitute(w, fresh)).collect();
        if program == "curl" {
            let url = ws.iter().find(|w| w.starts_with("http://")).expect("a URL");
            let (host, path) = url["http://".len()..].split_once('/').unwrap();
            let (code, body) = http_get(host, &format!("/{path}"));
            assert_eq!(code, 200, "{line}: {body}");
            return;
        }
        assert_eq!(
            program, "busway",
            "{line}: a command this test does not know"
        );
        let uses_etcd = ws.iter().any(|w| w == "--etcd");
        if uses_etcd && self.etcd.is_none() {
            eprintln!("readme: skipped without etcd: {line}");
            return;
        }
        let hub = is_node && !self.hub_started;
        if hub {
            self.hub_started = true;
            if let Some(etcd) = &self.etcd {
                ws.extend(["--etcd".into(), etcd.url()]);
            }
        }
        Self::shorten(&mut ws);
        let redirect = ws.iter().position(|w| w == ">").map(|at| {
            let file = ws[at + 1].clone();
            ws.truncate(at);
            file
        });
        let mut cmd = Command::new(BIN);
        cmd.args(&ws)
            .current_dir(&self.dir)
            .envs(env)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut p = Proc(cmd.spawn().expect("busway starts"));
        match ws.first().map(String::as_str) {
            Some("node") => {
                let out = BufReader::new(p.0.stdout.take().unwrap());
                let lines = lines_of(out);
                wait_lines(&lines, 1, |l| l.starts_with("listening on"), line);
                if hub {
                    let err = lines_of(BufReader::new(p.0.stderr.take().unwrap()));
                    self.outputs.extend([lines, err]);
                    self.background.push(p);
                } else {
                    stop_gracefully(p, line);
                }
            }
            Some("listen") => {
                let listens = ws.iter().any(|w| w == "--listen");
                let out = lines_of(BufReader::new(p.0.stdout.take().unwrap()));
                let err = lines_of(BufReader::new(p.0.stderr.take().unwrap()));
                if listens {
                    wait_lines(&out, 1, |l| l.starts_with("listening on"), line);
                } else {
                    wait_lines(&err, 1, |l| l.contains(" up"), line);
                }
                self.outputs.extend([out, err]);
                self.background.push(p);
            }
            _ => {
                let (ok, code, stdout, err) = finish(p, None);
                assert!(ok, "{line}: exit {code:?}\n{stdout}\n{err}");
                if let Some(file) = redirect {
                    let fresh = format!(":{}\"", free_port());
                    let text = stdout.replace(":7000\"", &fresh);
                    std::fs::write(self.dir.join(file), text).unwrap();
                }
            }
        }
    }
}

/// SIGTERM to a node; it must exit 0 within `LIMIT`.
fn stop_gracefully(mut p: Proc, line: &str) {
    let pid = p.0.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let status = exited(&mut p, line);
    assert!(status.success(), "{line}: {status:?} after SIGTERM");
}

#[test]
fn every_command_line_of_the_readme_runs_as_written() {
    let dir = std::env::temp_dir().join(format!("busway-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("secret"),
        format!("{:032x}", std::process::id() as u128 * 7919),
    )
    .unwrap();
    let mut run = Readme {
        dir: dir.clone(),
        ports: HashMap::new(),
        etcd: Etcd::start_on("readme", "127.0.0.1"),
        background: Vec::new(),
        outputs: Vec::new(),
        hub_started: false,
    };
    let lines = readme_lines();
    assert!(lines.len() > 30, "{lines:?}");
    for line in &lines {
        for command in line.split(" && ") {
            run.run(line, command);
        }
    }
    drop(run);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn readme_lines_split_as_a_shell_would() {
    assert_eq!(
        words(r#"busway send --to 1 "via the relay" [--count N] x"#),
        ["busway", "send", "--to", "1", "via the relay", "x"]
    );
    assert_eq!(words(r#"a "" b"#), ["a", "", "b"]);
}
