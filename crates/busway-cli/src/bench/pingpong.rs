//! `busway bench --pingpong`: muduo's ping-pong method (seed 002). N sessions, each one message
//! of S bytes in flight, echoed back and forth; MiB/s the client receives. Beside it, in the
//! same run, muduo's own baseline: an epoll (mio) echo client and server between two processes
//! with N connections, one event loop per thread on each side.

use super::worker::Report;
use super::{listen_addr, ratio, receiver_then_sender, relayed_pair, sysinfo};
use super::{BenchArgs, Spec, WORKER_GRACE_SECS};
use serde::Serialize;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

/// Transports a ping-pong row can run over (the raw baseline needs two processes and sockets).
const PINGPONG_TRANSPORTS: [&str; 5] = ["tcp4", "tcp6", "unix", "shm", "relay4"];

/// One row of the `--pingpong` table.
#[derive(Serialize, Debug)]
struct PingpongRow {
    workload: &'static str,
    transport: String,
    sessions: usize,
    size: usize,
    /// Event loops: the nodes' dedicated I/O threads and the raw baseline's epoll threads, on
    /// each side; 0: the nodes' links on the worker's own thread, one raw loop.
    io_threads: usize,
    mib_per_sec: f64,
    /// The epoll echo over N connections of the same kind of socket (shm: unix, where its
    /// links start; relay4: tcp4 between the two ends).
    raw_mib_per_sec: f64,
    /// `mib_per_sec / raw_mib_per_sec`: above 1 when busway moves the more (see `ratio`).
    busway_over_raw: f64,
    /// The same figure under its first name, for the scripts that read it.
    ratio_to_raw: f64,
}

impl PingpongRow {
    /// The row of `transport` with `sessions` sessions of `size` bytes over `io_threads`
    /// loops: what busway's client received beside what the epoll echo's did.
    fn new(
        transport: &str,
        sessions: usize,
        size: usize,
        io_threads: usize,
        busway: &Report,
        raw: &Report,
    ) -> Self {
        let mib = |r: &Report| r.bytes as f64 / r.secs.max(1e-9) / f64::from(1 << 20);
        PingpongRow {
            workload: "pingpong",
            transport: transport.to_owned(),
            sessions,
            size,
            io_threads,
            mib_per_sec: mib(busway),
            raw_mib_per_sec: mib(raw),
            busway_over_raw: ratio::of_rates(mib(busway), mib(raw)),
            ratio_to_raw: ratio::of_rates(mib(busway), mib(raw)),
        }
    }
}

/// Runs `--pingpong`: one row per transport, event-loop count, session count and size.
pub(super) fn run(args: &BenchArgs, specs: &[Spec]) -> Result<ExitCode, String> {
    let mut transports: Vec<&str> = specs.iter().map(|s| s.transport.as_str()).collect();
    transports.dedup();
    transports.retain(|t| PINGPONG_TRANSPORTS.contains(t));
    if transports.is_empty() {
        return Err(format!(
            "--pingpong runs over {}",
            PINGPONG_TRANSPORTS.join(", ")
        ));
    }
    let loops = args.loop_counts();
    let mut rows = Vec::new();
    let mut n = 3000;
    for t in transports {
        for &io in &loops {
            for &sessions in &args.sessions {
                for &size in &args.pingpong_sizes {
                    n += 2;
                    let row = measure(args, t, io, sessions, size, n)?;
                    if args.json {
                        println!("{}", serde_json::to_string(&row).unwrap_or_default());
                    } else {
                        eprintln!(
                            "{t} {sessions} x {size} B, {} loops: {:.0} MiB/s (raw {:.0})",
                            row.io_threads, row.mib_per_sec, row.raw_mib_per_sec
                        );
                    }
                    rows.push(row);
                }
            }
        }
    }
    args.plot(super::plot::Chart {
        name: "pingpong",
        title: "busway bench --pingpong: N sessions, one message each in flight".into(),
        unit: "MiB/s the client receives",
        lower_is_better: false,
        series: ["busway".into(), "raw (epoll echo, N connections)".into()],
        rows: rows
            .iter()
            .map(|r| {
                (
                    format!(
                        "{} {} x {} B loops {}",
                        r.transport, r.sessions, r.size, r.io_threads
                    ),
                    r.mib_per_sec,
                    r.raw_mib_per_sec,
                )
            })
            .collect(),
    })?;
    if !args.json {
        print!("{}", table(&rows));
    }
    Ok(ExitCode::SUCCESS)
}

fn measure(
    args: &BenchArgs,
    t: &str,
    io: usize,
    sessions: usize,
    size: usize,
    n: usize,
) -> Result<PingpongRow, String> {
    let spec = Spec {
        transport: t.to_owned(),
        size_min: size,
        size_max: size,
        api: "single".into(),
    };
    let sessions_arg = sessions.to_string();
    let io_arg = io.to_string();
    let extra = [
        "--sessions",
        sessions_arg.as_str(),
        "--io-threads",
        io_arg.as_str(),
    ];
    // Opening thousands of connections takes a while before the clock starts.
    let limit = Duration::from_secs_f64(args.duration * 2.0 + WORKER_GRACE_SECS);
    let (bus, _) = if t == "relay4" {
        relayed_pair(args, &spec, false, &listen_addr(t, n), &extra, limit)?
    } else {
        receiver_then_sender(args, &spec, false, &listen_addr(t, n), &extra, limit)?
    };
    let raw_t = match t {
        "relay4" => "tcp4",
        "shm" => "unix",
        other => other,
    };
    let raw_spec = Spec {
        transport: raw_t.to_owned(),
        ..spec
    };
    let (raw, _) = receiver_then_sender(
        args,
        &raw_spec,
        true,
        &listen_addr(raw_t, n + 1),
        &extra,
        limit,
    )?;
    Ok(PingpongRow::new(t, sessions, size, io, &bus, &raw))
}

/// The `--pingpong` table, its header lines first.
fn table(rows: &[PingpongRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "busway bench --pingpong: N sessions, each one message of S bytes in flight, echoed by both sides; MiB/s the client receives; raw: an epoll (mio) echo client and server, two processes, N connections (shm: over unix sockets; relay4: tcp4 between the two ends); loops: I/O threads per side (0: the nodes' links on the worker's own thread, one raw loop); busway/raw: busway's MiB/s over raw's, higher is better for busway"
    );
    let _ = writeln!(s, "machine: {}", sysinfo::machine());
    let _ = writeln!(
        s,
        "{:<7} {:>5} {:>9} {:>7} {:>11} {:>11} {:>10}",
        "link", "loops", "sessions", "size B", "MiB/s", "raw MiB/s", "busway/raw"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<7} {:>5} {:>9} {:>7} {:>11.0} {:>11.0} {:>10.2}",
            r.transport,
            r.io_threads,
            r.sessions,
            r.size,
            r.mib_per_sec,
            r.raw_mib_per_sec,
            r.busway_over_raw
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::tests::{json_figure, report};
    use super::*;

    #[test]
    fn the_pingpong_ratio_is_above_one_when_busway_moves_more() {
        let busway = report(1_000, 4 << 20, [0.0; 3]);
        let raw = report(1_000, 1 << 20, [0.0; 3]);
        let row = PingpongRow::new("tcp4", 100, 4096, 1, &busway, &raw);
        assert_eq!(json_figure(&row, "mib_per_sec"), 4.0);
        assert_eq!(json_figure(&row, "busway_over_raw"), 4.0);
        assert_eq!(json_figure(&row, "ratio_to_raw"), 4.0);
        let table = table(&[row]);
        assert_eq!(ratio::column(&table, "busway/raw"), [4.0], "{table}");
    }
}
