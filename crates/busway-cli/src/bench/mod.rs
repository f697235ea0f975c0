//! `busway bench`: the seed's throughput table (one sender, one receiver, one link), each row
//! beside the raw baseline measured in the same run.
//!
//! Every measurement is two worker processes (this binary's hidden `bench-worker`): a receiver
//! that listens and a sender that dials, so each side's CPU time and peak memory are its own.
//! Rounds alternate busway and raw, so both see the same noise; the table reports the median
//! with min-max.

mod baseline;
mod broadcast;
pub(crate) mod broadcast_worker;
mod calls;
mod idle;
mod pingpong;
mod pingpong_bus;
mod pingpong_raw;
mod plot;
mod ratio;
mod report;
mod round_trips;
mod rpc;
mod sizes;
mod sysinfo;
mod tls;
pub(crate) mod worker;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use worker::Report;

/// Extra time a worker may take beyond the run itself before it is killed, in seconds.
const WORKER_GRACE_SECS: f64 = 30.0;

#[derive(Args, Debug)]
#[command(after_help = ratio::SCHEME)]
pub(crate) struct BenchArgs {
    /// Transports to measure, comma-separated: tcp4, tcp6, unix, shm (a unix link whose data
    /// moves to shared-memory rings; raw: the bare ring between the two processes), mem (both
    /// nodes in one process, on two threads: an in-process channel; raw: the bare ring between
    /// the two threads), tls4 (tcp4 with TLS, certificates made for the run; raw: plain tcp4,
    /// so its ratio is what TLS costs), relay4 (sender -> relay -> receiver over tcp4, three
    /// processes), and
    /// relay4-stuck (relay4 while the sender also streams, through the same relay, to a
    /// destination that never reads; its baseline is relay4 alone, so its ratio is how much of
    /// its rate the receiver keeps; not in the default set).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "tcp4,tcp6,unix,shm,mem,relay4"
    )]
    transports: Vec<String>,
    /// Message size ranges in bytes, comma-separated MIN-MAX (sizes uniform in the range).
    #[arg(long, value_delimiter = ',', default_value = "8-128,8-16384")]
    sizes: Vec<String>,
    /// Seconds each sender sends, per round.
    #[arg(long, default_value_t = 1.0)]
    duration: f64,
    /// Rounds per row (the median is reported).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Where the node runs its links: `current` (the worker's thread) or `dedicated` (an I/O
    /// thread of its own beside the application's).
    #[arg(long, default_value = "current")]
    io: String,
    /// How the sender hands messages to busway: `batch` (`send_batch`, 256 copied at a time),
    /// `single` (one `send` per message, the payload shared as `Bytes`, no copy), or `auto`:
    /// `batch` for rows whose messages fit the copy limit (2 KiB), `single` beyond (what an
    /// application holding large payloads in `Bytes` does).
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    api: Vec<String>,
    /// Print one JSON object per row instead of the table.
    #[arg(long)]
    json: bool,
    /// Round-trip latency instead of throughput: one message of the smallest size of the
    /// first range out, its echo back, `--round-trips` times; p50/p99/p99.9 per transport, and
    /// for shm and mem with the reader sleeping at once (blocking), spinning a little first
    /// (spin-then-sleep, the default), and never sleeping (spinning).
    #[arg(long)]
    latency: bool,
    /// Round trips measured per row with `--latency` (after a tenth as many to warm up).
    #[arg(long, default_value_t = 20_000)]
    round_trips: usize,
    /// Memory per idle connection instead of throughput: a `busway node` with this many idle
    /// connections (comma-separated counts, e.g. `1000,10000`), its resident memory before
    /// and after.
    #[arg(long, value_delimiter = ',')]
    idle: Vec<usize>,
    /// Calls instead of one-way messages: 64-byte requests answered with their payload, from
    /// `--concurrency` async tasks at once; calls/s and p50/p99/p99.9 per transport, beside the
    /// same round trips with as many in flight over a bare socket or bare rings.
    #[arg(long)]
    rpc: bool,
    /// Concurrent calls per `--rpc` row, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,100,10000")]
    concurrency: Vec<usize>,
    /// muduo's ping-pong (seed 002) instead of one-way messages: `--sessions` sessions, each
    /// one message of a `--pingpong-sizes` size in flight, echoed by both sides; MiB/s the
    /// client receives, beside an epoll echo client and server with as many connections.
    #[arg(long)]
    pingpong: bool,
    /// Sessions per `--pingpong` row, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,100,1000,10000")]
    sessions: Vec<usize>,
    /// Message sizes of `--pingpong` rows in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "4096,16384")]
    pingpong_sizes: Vec<usize>,
    /// Event loops for `--rpc` and `--pingpong` rows, comma-separated (one row per count): the
    /// nodes' dedicated I/O threads (muduo's model: one loop per thread, a link stays on one;
    /// 0: the links on the worker's own thread), and the raw ping-pong's epoll threads on each
    /// side (at least one). Without it, `--io` decides (current: 0, dedicated: 1).
    #[arg(long, value_delimiter = ',')]
    io_threads: Vec<usize>,
    /// One publisher, `--receivers` members of a group instead of one-way messages:
    /// deliveries/s, ns per delivery and the most bytes one link carried per publish, over
    /// mem, shm, tcp4 and relay4 (of `--transports`), beside the same fan-out done with one
    /// unicast send per member in the same run.
    #[arg(long)]
    broadcast: bool,
    /// Members per `--broadcast` row, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    receivers: Vec<usize>,
    /// Payload size of `--broadcast` rows in bytes.
    #[arg(long, default_value_t = 64)]
    broadcast_size: usize,
    /// `--broadcast` rows with group logs off (`NodeConfig::group_logs`): every member gets
    /// its publishes by its link, as before logs (for an A/B in one binary).
    #[arg(long)]
    no_group_logs: bool,
    /// Also write the table as an SVG chart into this directory (busway beside raw, one pair
    /// of bars per row, on a log axis when the largest value is over 100 times the smallest):
    /// throughput.svg, latency.svg, rpc.svg, pingpong.svg or broadcast.svg.
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
    /// Throughput rows only: compare each row's ratio to raw (the median of its rounds') with
    /// this machine's baseline in FILE (as `--save-baseline` writes it), print the comparison,
    /// and exit with status 1 if the rows together (their geometric mean) fell more than
    /// `--tolerance` below it, or one row alone more than three times that. Rows whose rounds
    /// spread over 50 % (interquartile range over median) are not judged; nor is a run on a
    /// machine (CPU model, cores) the file has no baseline for.
    #[arg(long, value_name = "FILE")]
    baseline: Option<std::path::PathBuf>,
    /// How far below the baseline the judged rows together may fall, as a fraction (0.10:
    /// 10 %); one row alone, three times that.
    #[arg(long, default_value_t = baseline::TOLERANCE_DEFAULT)]
    tolerance: f64,
    /// Throughput rows only: write this run's rows into FILE as this machine's baseline
    /// (other machines' baselines in it are kept).
    #[arg(long, value_name = "FILE")]
    save_baseline: Option<std::path::PathBuf>,
}

impl BenchArgs {
    /// The event-loop counts to run each `--rpc` or `--pingpong` row with (see `io_threads`).
    fn loop_counts(&self) -> Vec<usize> {
        match (self.io_threads.is_empty(), self.io.as_str()) {
            (false, _) => self.io_threads.clone(),
            (true, "dedicated") => vec![1],
            (true, _) => vec![0],
        }
    }

    /// Writes `chart` if `--plot` asked for it, and says where.
    fn plot(&self, chart: plot::Chart) -> Result<(), String> {
        if let Some(dir) = &self.plot {
            let path = plot::write(dir, &chart)?;
            eprintln!("busway bench: chart written to {}", path.display());
        }
        Ok(())
    }
}

/// One row of the latency table.
#[derive(Serialize, Debug)]
struct LatencyRow {
    workload: &'static str,
    transport: String,
    mode: &'static str,
    size: usize,
    round_trips: usize,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    /// The same round trips with no bus: bare rings (shm, mem) or a bare socket.
    raw_p50_us: f64,
    raw_p99_us: f64,
    raw_p999_us: f64,
    /// `raw_p50_us / p50_us`: above 1 when busway's round trip is the shorter (see `ratio`).
    p50_raw_over_busway: f64,
    /// `p50_us / raw_p50_us`, the one ratio that reads lower is better: kept as it was for
    /// the scripts that read it; `p50_raw_over_busway` is the one that reads as the others.
    p50_ratio_to_raw: f64,
}

impl LatencyRow {
    /// The row of `transport` in `mode`: busway's round trips beside the raw ones.
    fn new(
        transport: &str,
        mode: &'static str,
        size: usize,
        round_trips: usize,
        busway: &Report,
        raw: &Report,
    ) -> Self {
        let ([p50, p99, p999], [raw_p50, raw_p99, raw_p999]) = (busway.rtt_us, raw.rtt_us);
        LatencyRow {
            workload: "latency",
            transport: transport.to_owned(),
            mode,
            size,
            round_trips,
            p50_us: p50,
            p99_us: p99,
            p999_us: p999,
            raw_p50_us: raw_p50,
            raw_p99_us: raw_p99,
            raw_p999_us: raw_p999,
            p50_raw_over_busway: ratio::of_times(p50, raw_p50),
            p50_ratio_to_raw: p50 / raw_p50,
        }
    }
}

/// Spins of the shm reader (the application's inbox) in the latency modes: none (it sleeps at
/// once: a futex wake-up and a runtime wake-up per message), the default (it spins a little
/// while, then sleeps), and enough (tens of milliseconds) that it does not sleep between two
/// round trips.
const LATENCY_MODES: [(&str, u32); 3] = [
    ("blocking", 0),
    (
        "spin-then-sleep",
        busway_shm::ring::SPINS_BEFORE_SLEEP_DEFAULT,
    ),
    ("spinning", 10_000_000),
];

fn run_latency(args: &BenchArgs, specs: &[Spec]) -> Result<ExitCode, String> {
    let size = specs.first().map_or(64, |s| s.size_min);
    let mut rows = Vec::new();
    let mut transports: Vec<&str> = specs.iter().map(|s| s.transport.as_str()).collect();
    transports.dedup();
    for (i, t) in transports.into_iter().enumerate() {
        if t.starts_with("relay4") {
            continue;
        }
        let modes: &[(&str, u32)] = if matches!(t, "shm" | "mem") {
            &LATENCY_MODES
        } else {
            &[("socket", 0)]
        };
        for (j, &(mode, spins)) in modes.iter().enumerate() {
            let spec = Spec {
                transport: t.to_owned(),
                size_min: size,
                size_max: size,
                api: "single".into(),
            };
            let limit = Duration::from_secs_f64(WORKER_GRACE_SECS * 2.0);
            let rt = args.round_trips.to_string();
            let sp = spins.to_string();
            let extra = ["--round-trips", rt.as_str(), "--shm-spins", sp.as_str()];
            let measure = |raw: bool| {
                let addr = listen_addr(t, 1000 + i * 8 + j * 2 + usize::from(raw));
                // The bare rings' round trips run between two threads of one worker.
                if t == "mem" || (raw && t == "shm") {
                    in_one_process(args, &spec, raw, &addr, &extra, limit)
                } else {
                    receiver_then_sender(args, &spec, raw, &addr, &extra, limit)
                }
            };
            let (r, _) = measure(false)?;
            let (raw, _) = measure(true)?;
            let row = LatencyRow::new(t, mode, size, args.round_trips, &r, &raw);
            if args.json {
                println!("{}", serde_json::to_string(&row).unwrap_or_default());
            }
            rows.push(row);
        }
    }
    args.plot(plot::Chart {
        name: "latency",
        title: format!("busway bench --latency: round trips of one {size}-byte message"),
        unit: "p50 round trip, microseconds",
        lower_is_better: true,
        series: ["busway".into(), "raw (bare ring or socket)".into()],
        rows: rows
            .iter()
            .map(|r| {
                (
                    format!("{} {}", r.transport, r.mode),
                    r.p50_us,
                    r.raw_p50_us,
                )
            })
            .collect(),
    })?;
    if !args.json {
        print!("{}", latency_table(args, size, &rows));
    }
    Ok(ExitCode::SUCCESS)
}

/// The `--latency` table, its header lines first.
fn latency_table(args: &BenchArgs, size: usize, rows: &[LatencyRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "busway bench --latency: round trips of one {size}-byte message and its echo, {} per row; microseconds; raw: bare rings between two threads (shm, mem: readers spinning as the bus's do), a bare blocking socket between two processes (unix, tcp); raw/busway: raw p50 over busway's, higher is better for busway",
        args.round_trips
    );
    let _ = writeln!(s, "machine: {}", sysinfo::machine());
    let _ = writeln!(
        s,
        "{:<6} {:<15} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}",
        "link", "mode", "p50", "p99", "p99.9", "raw p50", "raw p99", "raw p99.9", "raw/busway"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<6} {:<15} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10.2}",
            r.transport,
            r.mode,
            r.p50_us,
            r.p99_us,
            r.p999_us,
            r.raw_p50_us,
            r.raw_p99_us,
            r.raw_p999_us,
            r.p50_raw_over_busway
        );
    }
    s
}

/// The sender api of a row (see `BenchArgs::api`).
fn api_for<'a>(_args: &BenchArgs, spec: &'a Spec) -> &'a str {
    match spec.api.as_str() {
        "auto" if spec.size_max > busway::limits::COPY_PAYLOAD_BYTES_MAX => "single",
        "auto" => "batch",
        other => other,
    }
}

/// One row of the table.
#[derive(Serialize, Debug)]
struct Row {
    workload: &'static str,
    transport: String,
    size_min: usize,
    size_max: usize,
    io: String,
    api: String,
    rounds: usize,
    duration_secs: f64,
    msgs_per_sec: f64,
    msgs_per_sec_min: f64,
    msgs_per_sec_max: f64,
    bytes_per_sec: f64,
    raw_msgs_per_sec: f64,
    raw_msgs_per_sec_min: f64,
    raw_msgs_per_sec_max: f64,
    raw_bytes_per_sec: f64,
    /// `msgs_per_sec / raw_msgs_per_sec`: above 1 when busway is the faster (see `ratio`).
    busway_over_raw: f64,
    /// The same figure under its first name, for the scripts that read it.
    ratio_to_raw: f64,
    sender_cpu_pct: f64,
    receiver_cpu_pct: f64,
    sender_peak_rss_kib: u64,
    receiver_peak_rss_kib: u64,
    raw_sender_cpu_pct: f64,
    raw_receiver_cpu_pct: f64,
    /// Each round's busway rate over the raw rate of the round run beside it (what
    /// `--baseline` compares: neighbouring rounds share the machine's noise).
    round_ratios: Vec<f64>,
}

struct Spec {
    transport: String,
    size_min: usize,
    size_max: usize,
    /// The sender's api (one of `BenchArgs::api`).
    api: String,
}

fn parse_specs(args: &BenchArgs) -> Result<Vec<Spec>, String> {
    let mut specs = Vec::new();
    for t in &args.transports {
        if !matches!(
            t.as_str(),
            "tcp4" | "tcp6" | "unix" | "shm" | "mem" | "tls4" | "relay4" | "relay4-stuck"
        ) {
            return Err(format!(
                "unknown transport {t:?} (expected tcp4, tcp6, unix, shm, mem, tls4, relay4 or relay4-stuck)"
            ));
        }
        for s in &args.sizes {
            let (lo, hi) = s
                .split_once('-')
                .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
                .ok_or_else(|| format!("size range {s:?} is not MIN-MAX"))?;
            if lo == 0 || lo > hi || hi > busway_core::frame::DEFAULT_BODY_LEN_MAX {
                return Err(format!(
                    "size range {s:?} must satisfy 1 <= MIN <= MAX <= {}",
                    busway_core::frame::DEFAULT_BODY_LEN_MAX
                ));
            }
            for api in &args.api {
                specs.push(Spec {
                    transport: t.clone(),
                    size_min: lo,
                    size_max: hi,
                    api: api.clone(),
                });
            }
        }
    }
    Ok(specs)
}

pub(crate) fn run(args: BenchArgs) -> Result<ExitCode, String> {
    if !(0.05..=600.0).contains(&args.duration) || args.rounds == 0 {
        return Err("--duration must be 0.05..=600 seconds and --rounds at least 1".into());
    }
    if args.round_trips == 0 {
        return Err("--round-trips must be at least 1".into());
    }
    if let Some(api) = args
        .api
        .iter()
        .find(|a| !matches!(a.as_str(), "batch" | "single" | "auto"))
    {
        return Err(format!("--api {api:?}: expected batch, single or auto"));
    }
    if !matches!(args.io.as_str(), "current" | "dedicated") {
        return Err(format!("--io {:?}: expected current or dedicated", args.io));
    }
    if !args.idle.is_empty() {
        idle::run(&args.idle, args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    if !(args.io_threads.is_empty() || args.rpc || args.pingpong) {
        return Err(
            "--io-threads applies to --rpc and --pingpong rows (use --io for throughput)".into(),
        );
    }
    if args.sessions.contains(&0) || args.concurrency.contains(&0) {
        return Err("--sessions and --concurrency: each count must be at least 1".into());
    }
    if let Some(s) = args
        .pingpong_sizes
        .iter()
        .find(|&&s| s == 0 || s > busway_core::frame::DEFAULT_BODY_LEN_MAX)
    {
        return Err(format!(
            "--pingpong-sizes {s}: must be 1..={}",
            busway_core::frame::DEFAULT_BODY_LEN_MAX
        ));
    }
    let judged = args.baseline.is_some() || args.save_baseline.is_some();
    if judged && (args.broadcast || args.pingpong || args.rpc || args.latency) {
        return Err("--baseline and --save-baseline judge throughput rows: drop --broadcast, --pingpong, --rpc and --latency".into());
    }
    if !(0.0..1.0).contains(&args.tolerance) {
        return Err(format!(
            "--tolerance {}: expected a fraction in 0..1 (0.12: 12 %)",
            args.tolerance
        ));
    }
    let specs = parse_specs(&args)?;
    if args.broadcast {
        return broadcast::run(&args);
    }
    if args.pingpong {
        return pingpong::run(&args, &specs);
    }
    if args.rpc {
        return rpc::run(&args, &specs);
    }
    if args.latency {
        return run_latency(&args, &specs);
    }
    let bar = ProgressBar::new((specs.len() * args.rounds * 2) as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for spec in &specs {
        match measure_row(&args, spec, &bar) {
            Ok(row) => {
                if args.json {
                    bar.suspend(|| println!("{}", serde_json::to_string(&row).unwrap_or_default()));
                }
                rows.push(row);
            }
            Err(e) => {
                bar.inc((args.rounds * 2) as u64);
                skipped.push(format!(
                    "{} {}-{}: {e}",
                    spec.transport, spec.size_min, spec.size_max
                ));
            }
        }
    }
    bar.finish_and_clear();
    tls::remove_certificates();
    args.plot(plot::Chart {
        name: "throughput",
        title: "busway bench: throughput, 1 sender -> 1 receiver, 1 link".into(),
        unit: "M msg/s (median of the rounds)",
        lower_is_better: false,
        series: ["busway".into(), "raw (same frames, no bus)".into()],
        rows: rows
            .iter()
            .map(|r| {
                (
                    format!("{} {} {}-{} B", r.transport, r.api, r.size_min, r.size_max),
                    r.msgs_per_sec / 1e6,
                    r.raw_msgs_per_sec / 1e6,
                )
            })
            .collect(),
    })?;
    if !args.json {
        print!("{}", table(&args, &rows));
    }
    for s in &skipped {
        eprintln!("busway bench: row skipped: {s}");
    }
    if rows.is_empty() {
        return Err("no row could be measured".into());
    }
    if let Some(path) = &args.save_baseline {
        let command: Vec<String> = std::env::args().skip(1).collect();
        baseline::save(path, &rows, format!("busway {}", command.join(" ")))?;
    }
    if let Some(path) = &args.baseline {
        if !baseline::check(path, &rows, args.tolerance)? {
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn listen_addr(transport: &str, n: usize) -> String {
    match transport {
        "tcp4" | "relay4" | "relay4-stuck" => "tcp://127.0.0.1:0".into(),
        "tls4" => "tls://127.0.0.1:0".into(),
        "tcp6" => "tcp://[::1]:0".into(),
        _ => format!(
            "unix://{}/busway-bench-{}-{n}.sock",
            std::env::temp_dir().display(),
            std::process::id()
        ),
    }
}

/// Sender and receiver reports of one run.
type Pair = (Report, Report);

fn measure_row(args: &BenchArgs, spec: &Spec, bar: &ProgressBar) -> Result<Row, String> {
    let mut bus: Vec<Pair> = Vec::new();
    let mut raw: Vec<Pair> = Vec::new();
    for round in 0..args.rounds {
        for is_raw in [false, true] {
            bar.set_message(format!(
                "{} {}-{} B {} round {}",
                spec.transport,
                spec.size_min,
                spec.size_max,
                if is_raw { "raw" } else { "busway" },
                round + 1
            ));
            let pair = run_pair(args, spec, is_raw, round)?;
            if is_raw { &mut raw } else { &mut bus }.push(pair);
            bar.inc(1);
        }
    }
    Ok(row_of(args, spec, &bus, &raw))
}

/// The row of `spec` from its rounds: busway's (`bus`) and the raw baseline's.
fn row_of(args: &BenchArgs, spec: &Spec, bus: &[Pair], raw: &[Pair]) -> Row {
    let rate = |p: &Pair| p.1.msgs as f64 / p.1.secs.max(1e-9);
    let byte_rate = |p: &Pair| p.1.bytes as f64 / p.1.secs.max(1e-9);
    let (m, lo, hi) = median_min_max(bus.iter().map(rate).collect());
    let (rm, rlo, rhi) = median_min_max(raw.iter().map(rate).collect());
    let cpu = |r: &Report| 100.0 * r.cpu_secs / r.wall_secs.max(1e-9);
    let med = |v: Vec<f64>| median_min_max(v).0;
    Row {
        workload: "throughput",
        transport: spec.transport.clone(),
        size_min: spec.size_min,
        size_max: spec.size_max,
        io: args.io.clone(),
        api: api_for(args, spec).to_owned(),
        rounds: args.rounds,
        duration_secs: args.duration,
        msgs_per_sec: m,
        msgs_per_sec_min: lo,
        msgs_per_sec_max: hi,
        bytes_per_sec: med(bus.iter().map(byte_rate).collect()),
        raw_msgs_per_sec: rm,
        raw_msgs_per_sec_min: rlo,
        raw_msgs_per_sec_max: rhi,
        raw_bytes_per_sec: med(raw.iter().map(byte_rate).collect()),
        busway_over_raw: ratio::of_rates(m, rm),
        ratio_to_raw: ratio::of_rates(m, rm),
        sender_cpu_pct: med(bus.iter().map(|p| cpu(&p.0)).collect()),
        receiver_cpu_pct: med(bus.iter().map(|p| cpu(&p.1)).collect()),
        sender_peak_rss_kib: bus.iter().map(|p| p.0.peak_rss_kib).max().unwrap_or(0),
        receiver_peak_rss_kib: bus.iter().map(|p| p.1.peak_rss_kib).max().unwrap_or(0),
        raw_sender_cpu_pct: med(raw.iter().map(|p| cpu(&p.0)).collect()),
        raw_receiver_cpu_pct: med(raw.iter().map(|p| cpu(&p.1)).collect()),
        round_ratios: bus
            .iter()
            .zip(raw)
            .map(|(b, r)| ratio::of_rates(rate(b), rate(r)))
            .collect(),
    }
}

fn median_min_max(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => (0.0, 0.0, 0.0),
        n => (v[n / 2], v[0], v[n - 1]),
    }
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn worker(
    args: &BenchArgs,
    spec: &Spec,
    role: &str,
    raw: bool,
    addr: &str,
    via_relay: bool,
) -> Result<KillOnDrop, String> {
    worker_with(args, spec, role, raw, addr, via_relay, &[])
}

/// Like `worker`, with `extra` arguments for the worker.
fn worker_with(
    args: &BenchArgs,
    spec: &Spec,
    role: &str,
    raw: bool,
    addr: &str,
    via_relay: bool,
    extra: &[&str],
) -> Result<KillOnDrop, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args(["bench-worker", role, "--addr", addr])
        .args(["--size-min", &spec.size_min.to_string()])
        .args(["--size-max", &spec.size_max.to_string()])
        .args(["--duration", &args.duration.to_string()])
        .args(["--io", &args.io])
        .args(["--api", api_for(args, spec)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if raw {
        cmd.arg("--raw");
    }
    if via_relay {
        cmd.arg("--via-relay");
    }
    if matches!(spec.transport.as_str(), "shm" | "mem") {
        cmd.arg("--shm");
    }
    if spec.transport == "tls4" && !raw {
        cmd.arg("--tls-dir").arg(tls::certificates()?);
    }
    cmd.args(extra);
    cmd.spawn()
        .map(KillOnDrop)
        .map_err(|e| format!("cannot start a worker: {e}"))
}

/// Reads the worker's last stdout line as its report; kills the worker if it takes longer
/// than `limit`.
fn finish(
    w: KillOnDrop,
    lines: &mut impl Iterator<Item = String>,
    limit: Duration,
) -> Result<Report, String> {
    finish_as(w, lines, limit)
}

/// Like `finish`, for a worker whose report is a `T`.
fn finish_as<T: serde::de::DeserializeOwned>(
    w: KillOnDrop,
    lines: &mut impl Iterator<Item = String>,
    limit: Duration,
) -> Result<T, String> {
    let child = Arc::new(Mutex::new(w));
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watched = child.clone();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(limit).is_err() {
            if let Ok(mut c) = watched.lock() {
                let _ = c.0.kill();
            }
        }
    });
    let last = lines.last();
    let _ = done_tx.send(());
    let _ = watchdog.join();
    let mut w = child.lock().map_err(|_| "worker lock poisoned")?;
    let status = w.0.wait().map_err(|e| e.to_string())?;
    let mut stderr = String::new();
    if let Some(mut e) = w.0.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    match last {
        Some(line) if status.success() => {
            serde_json::from_str(&line).map_err(|e| format!("bad worker report {line:?}: {e}"))
        }
        _ => Err(format!("worker failed ({status}): {}", stderr.trim())),
    }
}

type Lines = std::iter::MapWhile<
    std::io::Lines<BufReader<std::process::ChildStdout>>,
    fn(std::io::Result<String>) -> Option<String>,
>;

/// The worker's stdout as lines, and its first line (`ready ...`) without the prefix.
fn ready(w: &mut KillOnDrop, who: &str) -> Result<(Lines, String), String> {
    let stdout = w.0.stdout.take().ok_or("worker has no stdout")?;
    let mut lines: Lines = BufReader::new(stdout).lines().map_while(Result::ok);
    let Some(first) = lines.next() else {
        let mut err = String::new();
        if let Some(mut e) = w.0.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        return Err(format!("{who} did not start: {}", err.trim()));
    };
    let rest = first
        .strip_prefix("ready ")
        .ok_or_else(|| format!("unexpected {who} line {first:?}"))?;
    Ok((lines, rest.to_owned()))
}

fn run_pair(args: &BenchArgs, spec: &Spec, raw: bool, round: usize) -> Result<Pair, String> {
    let limit = Duration::from_secs_f64(args.duration + WORKER_GRACE_SECS);
    let addr = if spec.transport == "tls4" && raw {
        // The baseline of TLS is the plain socket.
        listen_addr("tcp4", 0)
    } else {
        listen_addr(&spec.transport, round * 2 + usize::from(raw))
    };
    if spec.transport == "relay4-stuck" {
        if raw {
            // The baseline: the same stream through the same relay, alone.
            return relayed_pair(args, spec, false, &addr, &[], limit);
        }
        return relayed_beside_a_stuck_destination(args, spec, &addr, limit);
    }
    if spec.transport == "relay4" {
        return relayed_pair(args, spec, raw, &addr, &[], limit);
    }
    if spec.transport == "mem" {
        return in_one_process(args, spec, raw, &addr, &[], limit);
    }
    receiver_then_sender(args, spec, raw, &addr, &[], limit)
}

/// Sender -> relay -> receiver, three processes (busway nodes, or bare sockets with `raw`);
/// `extra` goes to each worker.
fn relayed_pair(
    args: &BenchArgs,
    spec: &Spec,
    raw: bool,
    addr: &str,
    extra: &[&str],
    limit: Duration,
) -> Result<Pair, String> {
    let mut relay = worker_with(args, spec, "relay", raw, addr, false, extra)?;
    let (mut relay_lines, relay_addr) = ready(&mut relay, "relay")?;
    let mut recv = worker_with(args, spec, "recv", raw, &relay_addr, true, extra)?;
    let (mut recv_lines, _) = ready(&mut recv, "receiver")?;
    let mut send = worker_with(args, spec, "send", raw, &relay_addr, true, extra)?;
    let send_lines = send.0.stdout.take().ok_or("worker has no stdout")?;
    let mut send_lines = BufReader::new(send_lines).lines().map_while(Result::ok);
    let s = finish(send, &mut send_lines, limit)?;
    let r = finish(recv, &mut recv_lines, limit)?;
    finish(relay, &mut relay_lines, limit)?;
    Ok((s, r))
}

/// Sender -> relay -> receiver, while the sender also streams through the relay to a fourth
/// node that never reads; the pair's reports are the measured stream's.
fn relayed_beside_a_stuck_destination(
    args: &BenchArgs,
    spec: &Spec,
    addr: &str,
    limit: Duration,
) -> Result<Pair, String> {
    let mut relay = worker_with(args, spec, "relay", false, addr, false, &["--peers", "3"])?;
    let (mut relay_lines, relay_addr) = ready(&mut relay, "relay")?;
    let mut recv = worker(args, spec, "recv", false, &relay_addr, true)?;
    let (mut recv_lines, _) = ready(&mut recv, "receiver")?;
    let mut stuck = worker(args, spec, "stuck", false, &relay_addr, true)?;
    let _stuck_lines = ready(&mut stuck, "stuck destination")?;
    let mut send = worker_with(
        args,
        spec,
        "send",
        false,
        &relay_addr,
        true,
        &["--stuck-to"],
    )?;
    let send_lines = send.0.stdout.take().ok_or("worker has no stdout")?;
    let mut send_lines = BufReader::new(send_lines).lines().map_while(Result::ok);
    let s = finish(send, &mut send_lines, limit)?;
    let r = finish(recv, &mut recv_lines, limit)?;
    // Killed: the relay sees its third peer go, and reports.
    drop(stuck);
    finish(relay, &mut relay_lines, limit)?;
    Ok((s, r))
}

/// Runs receiver and sender in one worker process (the `mem` row); returns their reports.
fn in_one_process(
    args: &BenchArgs,
    spec: &Spec,
    raw: bool,
    addr: &str,
    extra: &[&str],
    limit: Duration,
) -> Result<Pair, String> {
    let mut w = worker_with(args, spec, "pair", raw, addr, false, extra)?;
    let stdout = w.0.stdout.take().ok_or("worker has no stdout")?;
    let mut seen = Vec::new();
    let mut lines = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .inspect(|l| seen.push(l.clone()));
    let r = finish(w, &mut lines, limit)?;
    let sender_line = seen
        .len()
        .checked_sub(2)
        .map(|i| seen[i].clone())
        .ok_or("the worker printed one report, expected two")?;
    let s = serde_json::from_str(&sender_line)
        .map_err(|e| format!("bad worker report {sender_line:?}: {e}"))?;
    Ok((s, r))
}

/// Starts a receiver listening at `addr`, then a sender dialing where it listens; returns their
/// reports once both are done (each killed past `limit`).
fn receiver_then_sender(
    args: &BenchArgs,
    spec: &Spec,
    raw: bool,
    addr: &str,
    extra: &[&str],
    limit: Duration,
) -> Result<Pair, String> {
    let mut recv = worker_with(args, spec, "recv", raw, addr, false, extra)?;
    let (mut recv_lines, bound) = ready(&mut recv, "receiver")?;
    let mut send = worker_with(args, spec, "send", raw, &bound, false, extra)?;
    let send_stdout = send.0.stdout.take().ok_or("worker has no stdout")?;
    let mut send_lines = BufReader::new(send_stdout).lines().map_while(Result::ok);
    let s = finish(send, &mut send_lines, limit)?;
    let r = finish(recv, &mut recv_lines, limit)?;
    Ok((s, r))
}

/// The throughput table, its header lines first.
fn table(args: &BenchArgs, rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "busway bench: throughput, 1 sender -> 1 receiver, 1 link; {} s x {} rounds per row, median [min-max]; sender api: {}; links on the {} thread; not pinned; busway/raw: busway's msg/s over raw's, higher is better for busway",
        args.duration,
        args.rounds,
        if args.api == ["auto"] {
            "auto (send_batch for messages up to 2 KiB, send(Bytes) for larger)".to_owned()
        } else {
            args.api.join(", ")
        },
        if args.io == "current" { "worker's own" } else { "a dedicated I/O" },
    );
    let _ = writeln!(s, "machine: {}", sysinfo::machine());
    let _ = writeln!(
        s,
        "{:<12} {:>9} {:>26} {:>9} {:>26} {:>9} {:>10} {:>13} {:>13} {:>15}",
        "link",
        "size B",
        "busway msg/s",
        "MB/s",
        "raw msg/s",
        "raw MB/s",
        "busway/raw",
        "cpu% snd/rcv",
        "raw cpu%",
        "rss KiB snd/rcv"
    );
    let m = |x: f64| format!("{:.2}M", x / 1e6);
    for r in rows {
        let _ = writeln!(
            s,
            "{:<12} {:>9} {:>26} {:>9.0} {:>26} {:>9.0} {:>10.2} {:>13} {:>13} {:>15}",
            if args.api.len() > 1 {
                format!("{} {}", r.transport, r.api)
            } else {
                r.transport.clone()
            },
            format!("{}-{}", r.size_min, r.size_max),
            format!(
                "{} [{}-{}]",
                m(r.msgs_per_sec),
                m(r.msgs_per_sec_min),
                m(r.msgs_per_sec_max)
            ),
            r.bytes_per_sec / 1e6,
            format!(
                "{} [{}-{}]",
                m(r.raw_msgs_per_sec),
                m(r.raw_msgs_per_sec_min),
                m(r.raw_msgs_per_sec_max)
            ),
            r.raw_bytes_per_sec / 1e6,
            r.busway_over_raw,
            format!("{:.0}/{:.0}", r.sender_cpu_pct, r.receiver_cpu_pct),
            format!("{:.0}/{:.0}", r.raw_sender_cpu_pct, r.raw_receiver_cpu_pct),
            format!("{}/{}", r.sender_peak_rss_kib, r.receiver_peak_rss_kib),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// `busway bench` alone, to parse its flags.
    #[derive(Parser)]
    struct Bench {
        #[command(flatten)]
        args: BenchArgs,
    }

    /// The arguments of `busway bench FLAGS`.
    pub(super) fn args(flags: &[&str]) -> BenchArgs {
        Bench::parse_from(std::iter::once("bench").chain(flags.iter().copied())).args
    }

    /// A worker's report: `msgs` messages of `bytes` bytes in all, in one second, and
    /// round trips of `rtt_us` (p50, p99, p99.9).
    pub(super) fn report(msgs: u64, bytes: u64, rtt_us: [f64; 3]) -> Report {
        Report {
            msgs,
            bytes,
            secs: 1.0,
            wall_secs: 1.0,
            rtt_us,
            ..Report::default()
        }
    }

    /// A JSON row's figure under `key`.
    pub(super) fn json_figure(row: &impl Serialize, key: &str) -> f64 {
        let row = serde_json::to_value(row).unwrap();
        row[key]
            .as_f64()
            .unwrap_or_else(|| panic!("no {key} in {row}"))
    }

    #[test]
    fn the_throughput_ratio_is_above_one_when_busway_sends_more() {
        let args = args(&["--rounds", "1"]);
        let spec = Spec {
            transport: "tcp4".into(),
            size_min: 8,
            size_max: 128,
            api: "auto".into(),
        };
        let pair = |msgs| {
            (
                report(msgs, msgs * 64, [0.0; 3]),
                report(msgs, msgs * 64, [0.0; 3]),
            )
        };
        let row = row_of(&args, &spec, &[pair(2_000_000)], &[pair(1_000_000)]);
        assert_eq!(json_figure(&row, "busway_over_raw"), 2.0);
        assert_eq!(json_figure(&row, "ratio_to_raw"), 2.0);
        assert_eq!(ratio::column(&table(&args, &[row]), "busway/raw"), [2.0]);
    }

    #[test]
    fn the_latency_ratio_is_above_one_when_busway_takes_less_time() {
        let args = args(&["--latency"]);
        let busway = report(0, 0, [5.0, 9.0, 20.0]);
        let raw = report(0, 0, [10.0, 18.0, 40.0]);
        let row = LatencyRow::new("shm", "spinning", 64, 100, &busway, &raw);
        assert_eq!(json_figure(&row, "p50_raw_over_busway"), 2.0);
        // The first name keeps its first meaning, for the scripts that read it.
        assert_eq!(json_figure(&row, "p50_ratio_to_raw"), 0.5);
        let table = latency_table(&args, 64, &[row]);
        assert_eq!(ratio::column(&table, "raw/busway"), [2.0], "{table}");
    }

    #[test]
    fn the_help_says_how_ratios_read() {
        let help = Bench::command().render_long_help().to_string();
        assert!(help.contains(ratio::SCHEME), "{help}");
    }
}
