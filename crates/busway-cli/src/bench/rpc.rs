//! `busway bench --rpc`: calls per second and their latency (p50/p99/p99.9) at 1, 100 and
//! 10,000 concurrent calls from async tasks, 64-byte payloads, per transport; beside the same
//! round trips with no bus and as many in flight: a bare socket (a writer thread keeping that
//! many requests out, a reader thread taking the echoes) or two bare rings (one thread pushing
//! and reading, an echoing thread).

use super::calls::RPC_PAYLOAD_BYTES;
use super::worker::Report;
use super::{in_one_process, listen_addr, receiver_then_sender, relayed_pair};
use super::{ratio, sysinfo, BenchArgs, Spec, WORKER_GRACE_SECS};
use serde::Serialize;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

/// One row of the `--rpc` table.
#[derive(Serialize, Debug)]
struct RpcRow {
    workload: &'static str,
    transport: String,
    concurrency: usize,
    size: usize,
    /// The nodes' dedicated I/O threads (`--io-threads`); 0: the links on the worker's thread.
    io_threads: usize,
    calls_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    /// The same round trips with no bus, as many in flight (see the module's note).
    raw_calls_per_sec: f64,
    raw_p50_us: f64,
    /// `calls_per_sec / raw_calls_per_sec`: above 1 when busway makes the more calls (see
    /// `ratio`).
    busway_over_raw: f64,
}

impl RpcRow {
    /// The row of `transport` at `concurrency` calls in flight over `io_threads` loops:
    /// busway's calls beside the raw round trips.
    fn new(
        transport: &str,
        concurrency: usize,
        io_threads: usize,
        busway: &Report,
        raw: &Report,
    ) -> Self {
        let rate = |r: &Report| r.msgs as f64 / r.secs.max(1e-9);
        RpcRow {
            workload: "rpc",
            transport: transport.to_owned(),
            concurrency,
            size: RPC_PAYLOAD_BYTES,
            io_threads,
            calls_per_sec: rate(busway),
            p50_us: busway.rtt_us[0],
            p99_us: busway.rtt_us[1],
            p999_us: busway.rtt_us[2],
            raw_calls_per_sec: rate(raw),
            raw_p50_us: raw.rtt_us[0],
            busway_over_raw: ratio::of_rates(rate(busway), rate(raw)),
        }
    }
}

/// Runs `--rpc`: one row per transport and concurrency.
pub(super) fn run(args: &BenchArgs, specs: &[Spec]) -> Result<ExitCode, String> {
    let mut transports: Vec<&str> = specs.iter().map(|s| s.transport.as_str()).collect();
    transports.dedup();
    let loops = args.loop_counts();
    let mut rows = Vec::new();
    for (i, t) in transports.into_iter().enumerate() {
        if matches!(t, "relay4-stuck" | "tls4") {
            continue;
        }
        for (j, (&c, io)) in args
            .concurrency
            .iter()
            .flat_map(|c| loops.iter().map(move |io| (c, *io)))
            .enumerate()
        {
            let spec = Spec {
                transport: t.to_owned(),
                size_min: RPC_PAYLOAD_BYTES,
                size_max: RPC_PAYLOAD_BYTES,
                api: "single".into(),
            };
            let calls = c.to_string();
            let io_arg = io.to_string();
            let extra = ["--calls", calls.as_str(), "--io-threads", io_arg.as_str()];
            let limit = Duration::from_secs_f64(args.duration * 2.0 + WORKER_GRACE_SECS);
            let n = 2000 + i * 64 + j * 2;
            let (bus, _) = match t {
                "mem" => in_one_process(args, &spec, false, &listen_addr(t, n), &extra, limit)?,
                "relay4" => relayed_pair(args, &spec, false, &listen_addr(t, n), &extra, limit)?,
                _ => receiver_then_sender(args, &spec, false, &listen_addr(t, n), &extra, limit)?,
            };
            // The baseline of a relayed call is the bare socket between the two ends.
            let raw_t = if t == "relay4" { "tcp4" } else { t };
            let raw_addr = listen_addr(raw_t, n + 1);
            let (raw, _) = if matches!(raw_t, "shm" | "mem") {
                in_one_process(args, &spec, true, &raw_addr, &extra, limit)?
            } else {
                receiver_then_sender(args, &spec, true, &raw_addr, &extra, limit)?
            };
            let row = RpcRow::new(t, c, io, &bus, &raw);
            if args.json {
                println!("{}", serde_json::to_string(&row).unwrap_or_default());
            } else {
                eprintln!(
                    "{t} x{c}, {} loops: {:.0} calls/s",
                    row.io_threads, row.calls_per_sec
                );
            }
            rows.push(row);
        }
    }
    args.plot(super::plot::Chart {
        name: "rpc",
        title: format!("busway bench --rpc: {RPC_PAYLOAD_BYTES}-byte calls from concurrent tasks"),
        unit: "k calls/s",
        lower_is_better: false,
        series: ["busway".into(), "raw (bare socket or rings)".into()],
        rows: rows
            .iter()
            .map(|r| {
                (
                    format!("{} x{} loops {}", r.transport, r.concurrency, r.io_threads),
                    r.calls_per_sec / 1e3,
                    r.raw_calls_per_sec / 1e3,
                )
            })
            .collect(),
    })?;
    if !args.json {
        print!("{}", table(&rows));
    }
    Ok(ExitCode::SUCCESS)
}

/// The `--rpc` table, its header lines first.
fn table(rows: &[RpcRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "busway bench --rpc: {RPC_PAYLOAD_BYTES}-byte calls from concurrent async tasks, each answered with its payload; latency in microseconds; raw: the same round trips with as many in flight over a bare socket (relay4: the bare tcp4 socket between its two ends) or two bare rings (shm, mem); busway/raw: busway's calls/s over raw's, higher is better for busway"
    );
    let _ = writeln!(s, "machine: {}", sysinfo::machine());
    let _ = writeln!(
        s,
        "{:<7} {:>5} {:>7} {:>11} {:>9} {:>9} {:>9} {:>11} {:>9} {:>10}",
        "link",
        "loops",
        "calls",
        "calls/s",
        "p50",
        "p99",
        "p99.9",
        "raw calls/s",
        "raw p50",
        "busway/raw"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<7} {:>5} {:>7} {:>11.0} {:>9.1} {:>9.1} {:>9.1} {:>11.0} {:>9.1} {:>10.2}",
            r.transport,
            r.io_threads,
            r.concurrency,
            r.calls_per_sec,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.raw_calls_per_sec,
            r.raw_p50_us,
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
    fn the_rpc_ratio_is_above_one_when_busway_makes_more_calls() {
        let busway = report(300_000, 0, [50.0, 90.0, 120.0]);
        let raw = report(100_000, 0, [20.0, 40.0, 60.0]);
        let row = RpcRow::new("tcp4", 100, 1, &busway, &raw);
        assert_eq!(json_figure(&row, "busway_over_raw"), 3.0);
        let table = table(&[row]);
        assert_eq!(ratio::column(&table, "busway/raw"), [3.0], "{table}");
    }
}
