//! `busway bench --broadcast` (issue #13): one publisher, R members of a group, per
//! transport: deliveries per second, nanoseconds per delivery, and the most bytes any one
//! link carried per publish; beside the same fan-out done with R unicast `send`s per message
//! on the same nodes and links, in the same run (see `broadcast_worker` for how a run goes
//! and what is checked).
//!
//! Rows: `mem` (members are nodes of the publisher's process: in-process channels), `shm`
//! (members in another process, over shared-memory rings), `tcp4` (members in another
//! process over TCP loopback), `relay4` (publisher -> relay -> members over tcp4, each in its
//! own process). All the members of a row are nodes of one process, on one thread.

use super::broadcast_worker::{BroadcastReport, TAG_BYTES};
use super::{
    finish_as, listen_addr, ratio, ready, sysinfo, BenchArgs, KillOnDrop, WORKER_GRACE_SECS,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

/// Transports a broadcast row runs over.
const BROADCAST_TRANSPORTS: [&str; 4] = ["mem", "shm", "tcp4", "relay4"];
/// Lines of a worker's log kept while it runs (the end says why it failed).
const ERROR_LINES_KEPT: usize = 20;
/// Lines of a failed worker's error shown (its first, and the last ones).
const ERROR_LINES_SHOWN: usize = 3;
/// Largest payload of a broadcast row, in bytes.
const BROADCAST_SIZE_MAX: usize = 64 << 10;
/// Extra time a run may take per member (starting the nodes, linking them), in seconds.
const STARTUP_SECS_PER_MEMBER: f64 = 0.02;

/// One row of the `--broadcast` table.
#[derive(Serialize, Debug)]
struct BroadcastRow {
    workload: &'static str,
    transport: String,
    receivers: usize,
    size: usize,
    rounds: usize,
    duration_secs: f64,
    /// Publishes per second times the members that received them (median of the rounds).
    deliveries_per_sec: f64,
    deliveries_per_sec_min: f64,
    deliveries_per_sec_max: f64,
    ns_per_delivery: f64,
    /// The most bytes any single link (the publisher's, the relay's) had queued per publish.
    link_bytes_per_publish: f64,
    /// Which link that was (`from->to` bus ids).
    busiest_link: String,
    /// The same messages sent to each member with one unicast `send` each.
    unicast_deliveries_per_sec: f64,
    unicast_ns_per_delivery: f64,
    unicast_link_bytes_per_publish: f64,
    unicast_busiest_link: String,
    /// `deliveries_per_sec / unicast_deliveries_per_sec`: above 1 when publishing to the
    /// group delivers more per second than the unicast sends (see `ratio`).
    publish_over_unicast: f64,
    /// The same figure under its first name, for the scripts that read it.
    ratio_to_unicast: f64,
    /// Peak resident memory of the members' process (mem: of the one process).
    members_peak_rss_kib: u64,
}

/// Runs `--broadcast`: one row per transport and member count.
pub(super) fn run(args: &BenchArgs) -> Result<ExitCode, String> {
    let transports: Vec<&str> = args
        .transports
        .iter()
        .map(String::as_str)
        .filter(|t| BROADCAST_TRANSPORTS.contains(t))
        .collect();
    if transports.is_empty() {
        return Err(format!(
            "--broadcast runs over {}",
            BROADCAST_TRANSPORTS.join(", ")
        ));
    }
    if args.receivers.is_empty() || args.receivers.contains(&0) {
        return Err("--receivers: each count must be at least 1".into());
    }
    if !(TAG_BYTES..=BROADCAST_SIZE_MAX).contains(&args.broadcast_size) {
        return Err(format!(
            "--broadcast-size must be {TAG_BYTES}..={BROADCAST_SIZE_MAX}"
        ));
    }
    let bar = ProgressBar::new((transports.len() * args.receivers.len() * args.rounds) as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    let mut n = 4000;
    for t in transports {
        for &r in &args.receivers {
            let mut runs = Vec::new();
            let mut measured = Ok(());
            for round in 0..args.rounds {
                bar.set_message(format!("{t} x{r} round {}", round + 1));
                n += 1;
                bar.inc(1);
                match run_once(args, t, r, n) {
                    Ok(run) => runs.push(run),
                    Err(e) => {
                        measured = Err(e);
                        bar.inc((args.rounds - round - 1) as u64);
                        break;
                    }
                }
            }
            match measured.and_then(|()| row_of(args, t, r, &runs)) {
                Ok(row) => {
                    if args.json {
                        bar.suspend(|| {
                            println!("{}", serde_json::to_string(&row).unwrap_or_default())
                        });
                    }
                    rows.push(row);
                }
                Err(e) => skipped.push(format!("{t} x{r}: {}", last_lines(&e))),
            }
        }
    }
    bar.finish_and_clear();
    args.plot(super::plot::Chart {
        name: "broadcast",
        title: format!(
            "busway bench --broadcast: 1 publisher -> R members, {} B",
            args.broadcast_size
        ),
        unit: "M deliveries/s (median of the rounds)",
        lower_is_better: false,
        series: ["busway publish".into(), "R unicast sends".into()],
        rows: rows
            .iter()
            .map(|r| {
                (
                    format!("{} x{}", r.transport, r.receivers),
                    r.deliveries_per_sec / 1e6,
                    r.unicast_deliveries_per_sec / 1e6,
                )
            })
            .collect(),
    })?;
    if !args.json {
        print!("{}", table(args, &rows));
    }
    // A row that lost or repeated a message, or did not finish, is not a figure.
    for s in &skipped {
        eprintln!("busway bench: broadcast row failed: {s}");
    }
    if skipped.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(1))
    }
}

/// The end of a failed worker's error (its log may run to thousands of lines).
fn last_lines(e: &str) -> String {
    let lines: Vec<&str> = e.lines().collect();
    let keep = lines.len().saturating_sub(ERROR_LINES_SHOWN);
    let mut out = lines[..1.min(lines.len())].join("");
    if keep > 1 {
        out.push_str(&format!(" [... {} lines ...] ", keep - 1));
    }
    out.push_str(&lines[keep.max(1)..].join("\n"));
    out
}

/// The publisher's and the members' figures of one run.
struct Run {
    publisher: [super::broadcast_worker::PublisherPhase; 2],
    members: [super::broadcast_worker::MembersPhase; 2],
    members_rss_kib: u64,
}

fn row_of(args: &BenchArgs, t: &str, r: usize, runs: &[Run]) -> Result<BroadcastRow, String> {
    let rate = |run: &Run, phase: usize| {
        run.members[phase].deliveries as f64 / run.members[phase].secs.max(1e-9)
    };
    let per_publish = |run: &Run, phase: usize| {
        run.publisher[phase].link_bytes_max as f64 / run.publisher[phase].publishes.max(1) as f64
    };
    for run in runs {
        for phase in 0..2 {
            let (sent, got) = (
                run.publisher[phase].publishes,
                run.members[phase].deliveries,
            );
            if got != sent * r as u64 {
                return Err(format!(
                    "{t} x{r}: {sent} messages sent to {r} members, {got} deliveries (phase {phase})"
                ));
            }
        }
    }
    let (m, lo, hi) = super::median_min_max(runs.iter().map(|x| rate(x, 0)).collect());
    let (um, _, _) = super::median_min_max(runs.iter().map(|x| rate(x, 1)).collect());
    // The busiest link of the round that put the most on one link per publish.
    let busiest = |phase: usize| {
        runs.iter()
            .max_by(|a, b| per_publish(a, phase).total_cmp(&per_publish(b, phase)))
            .map(|x| {
                (
                    per_publish(x, phase),
                    x.publisher[phase].busiest_link.clone(),
                )
            })
            .unwrap_or_default()
    };
    let (bytes, link) = busiest(0);
    let (ubytes, ulink) = busiest(1);
    Ok(BroadcastRow {
        workload: "broadcast",
        transport: t.to_owned(),
        receivers: r,
        size: args.broadcast_size,
        rounds: args.rounds,
        duration_secs: args.duration,
        deliveries_per_sec: m,
        deliveries_per_sec_min: lo,
        deliveries_per_sec_max: hi,
        ns_per_delivery: 1e9 / m.max(1e-9),
        link_bytes_per_publish: bytes,
        busiest_link: link,
        unicast_deliveries_per_sec: um,
        unicast_ns_per_delivery: 1e9 / um.max(1e-9),
        unicast_link_bytes_per_publish: ubytes,
        unicast_busiest_link: ulink,
        publish_over_unicast: ratio::of_rates(m, um),
        ratio_to_unicast: ratio::of_rates(m, um),
        members_peak_rss_kib: runs.iter().map(|x| x.members_rss_kib).max().unwrap_or(0),
    })
}

/// A broadcast worker, and the thread that reads its log as it is written: a thousand
/// nodes' log lines would fill the pipe and stop the worker while nobody reads it.
struct Worker {
    process: KillOnDrop,
    log: Option<std::thread::JoinHandle<String>>,
}

impl Worker {
    /// Its report, once it is done (killed past `limit`); its log's end says why not.
    fn finish(
        mut self,
        lines: &mut super::Lines,
        limit: Duration,
    ) -> Result<BroadcastReport, String> {
        let r = finish_as(self.process, lines, limit);
        let log = self
            .log
            .take()
            .and_then(|l| l.join().ok())
            .unwrap_or_default();
        r.map_err(|e| format!("{e}{}", log.trim()))
    }
}

/// Starts one broadcast worker.
fn spawn(
    args: &BenchArgs,
    role: &str,
    addr: &str,
    transport: &str,
    receivers: usize,
) -> Result<Worker, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args(["bench-broadcast-worker", role, "--addr", addr])
        .args(["--receivers", &receivers.to_string()])
        .args(["--size", &args.broadcast_size.to_string()])
        .args(["--duration", &args.duration.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if matches!(transport, "shm" | "mem") {
        cmd.arg("--shm");
    }
    if transport == "relay4" {
        cmd.arg("--via-relay");
    }
    if args.no_group_logs {
        cmd.arg("--no-group-logs");
    }
    let mut process = cmd
        .spawn()
        .map(KillOnDrop)
        .map_err(|e| format!("cannot start a broadcast worker: {e}"))?;
    let log = process.0.stderr.take().map(|e| {
        std::thread::spawn(move || {
            let mut tail = std::collections::VecDeque::new();
            for line in BufReader::new(e).lines().map_while(Result::ok) {
                if tail.len() == ERROR_LINES_KEPT {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
            Vec::from(tail).join("\n")
        })
    });
    Ok(Worker { process, log })
}

/// One run of a row: its processes started, both phases done, their reports read.
fn run_once(args: &BenchArgs, t: &str, r: usize, n: usize) -> Result<Run, String> {
    let limit = Duration::from_secs_f64(
        2.0 * args.duration + WORKER_GRACE_SECS + r as f64 * STARTUP_SECS_PER_MEMBER,
    );
    let addr = listen_addr(t, n);
    let lines_of = |w: &mut Worker| -> Result<super::Lines, String> {
        let stdout = w.process.0.stdout.take().ok_or("worker has no stdout")?;
        Ok(BufReader::new(stdout).lines().map_while(Result::ok))
    };
    let (publisher, members) = match t {
        "mem" => {
            let mut all = spawn(args, "all", &addr, t, r)?;
            let mut lines = lines_of(&mut all)?;
            let both = all.finish(&mut lines, limit)?;
            (both.clone(), both)
        }
        "relay4" => {
            let mut relay = spawn(args, "relay", &addr, t, r)?;
            let (_relay_lines, relay_addr) = ready(&mut relay.process, "relay")?;
            let mut publisher = spawn(args, "publisher", &relay_addr, t, r)?;
            let (mut pub_lines, _) = ready(&mut publisher.process, "publisher")?;
            let mut members = spawn(args, "members", &relay_addr, t, r)?;
            let mut member_lines = lines_of(&mut members)?;
            let p = publisher.finish(&mut pub_lines, limit)?;
            let m = members.finish(&mut member_lines, limit)?;
            // Killed: it runs until then.
            drop(relay);
            (p, m)
        }
        _ => {
            let mut publisher = spawn(args, "publisher", &addr, t, r)?;
            let (mut pub_lines, bound) = ready(&mut publisher.process, "publisher")?;
            let mut members = spawn(args, "members", &bound, t, r)?;
            let mut member_lines = lines_of(&mut members)?;
            let p = publisher.finish(&mut pub_lines, limit)?;
            let m = members.finish(&mut member_lines, limit)?;
            (p, m)
        }
    };
    Ok(Run {
        publisher: publisher
            .publisher
            .ok_or("the publisher reported nothing")?,
        members: members.members.ok_or("the members reported nothing")?,
        members_rss_kib: members.peak_rss_kib,
    })
}

/// The `--broadcast` table, its header lines first.
fn table(args: &BenchArgs, rows: &[BroadcastRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "busway bench --broadcast: 1 publisher -> R members of a group, {} B payloads, {} s x {} rounds per row, median [min-max]; unicast: the same messages sent to each member with one send each, on the same links in the same run; B/link: the most bytes any one link (publisher's or relay's, or the publisher's group log) had queued per publish, headers included; all members of a row in one process, one thread; not pinned; group logs {}; publish/unicast: the group's deliveries/s over the unicast sends', higher is better for busway's publish",
        args.broadcast_size,
        args.duration,
        args.rounds,
        if args.no_group_logs { "off" } else { "on" }
    );
    let _ = writeln!(s, "machine: {}", sysinfo::machine());
    let _ = writeln!(
        s,
        "{:<7} {:>7} {:>26} {:>9} {:>9} {:>13} {:>9} {:>10} {:>15} {:>10}",
        "link",
        "members",
        "deliveries/s",
        "ns/deliv",
        "B/link",
        "unicast dl/s",
        "ns/deliv",
        "B/link",
        "publish/unicast",
        "rss KiB"
    );
    let m = |x: f64| format!("{:.2}M", x / 1e6);
    for r in rows {
        let _ = writeln!(
            s,
            "{:<7} {:>7} {:>26} {:>9.1} {:>9.1} {:>13} {:>9.1} {:>10.1} {:>15.2} {:>10}",
            r.transport,
            r.receivers,
            format!(
                "{} [{}-{}]",
                m(r.deliveries_per_sec),
                m(r.deliveries_per_sec_min),
                m(r.deliveries_per_sec_max)
            ),
            r.ns_per_delivery,
            r.link_bytes_per_publish,
            m(r.unicast_deliveries_per_sec),
            r.unicast_ns_per_delivery,
            r.unicast_link_bytes_per_publish,
            r.publish_over_unicast,
            r.members_peak_rss_kib,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::broadcast_worker::{MembersPhase, PublisherPhase};
    use super::super::tests::{args, json_figure};
    use super::*;

    #[test]
    fn the_broadcast_ratio_is_above_one_when_publishing_delivers_more() {
        let args = args(&["--broadcast", "--rounds", "1"]);
        let publisher = PublisherPhase {
            publishes: 1_000,
            secs: 1.0,
            link_bytes_max: 102_000,
            busiest_link: "1->2".into(),
        };
        // Both phases deliver the 1,000 publishes to the 10 members; the publish in half the time.
        let members = |secs| MembersPhase {
            deliveries: 10_000,
            secs,
        };
        let run = Run {
            publisher: [publisher.clone(), publisher],
            members: [members(0.5), members(1.0)],
            members_rss_kib: 1,
        };
        let row = row_of(&args, "tcp4", 10, &[run]).unwrap();
        assert_eq!(json_figure(&row, "publish_over_unicast"), 2.0);
        assert_eq!(json_figure(&row, "ratio_to_unicast"), 2.0);
        let table = table(&args, &[row]);
        assert_eq!(ratio::column(&table, "publish/unicast"), [2.0], "{table}");
    }
}
