//! `busway`: run a node, send and listen from a shell, and benchmark the bus.

// The status document is one `json!` literal with a key per counter: past the default limit.
#![recursion_limit = "256"]

mod admin;
mod admin_serve;
mod bench;
mod call;
mod cert;
mod common;
mod config_cmd;
mod fd_limit;
mod human;
mod link_wait;
mod listen;
mod metrics_text;
mod prom;
mod say;
mod send;
mod status;
mod status_page;
mod verify;

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "busway",
    version,
    about = "A brokerless message bus for backend server processes"
)]
struct Cli {
    /// How log lines are written to stderr (levels per module with `BUSWAY_LOG`, e.g.
    /// `BUSWAY_LOG=debug` or `busway=debug,busway::groups=trace`): `text`, or `json`, one
    /// object per line (timestamp, level, target, message and fields) for a log collector.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "BUSWAY_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// See `Cli::log_format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node until Ctrl-C (a standalone relay/hub), logging its peers; messages addressed
    /// to the node itself are counted and discarded (`listen` shows them).
    Node(NodeCmd),
    /// Receive messages and print them (or check their sequence numbers with --verify).
    Listen(listen::ListenArgs),
    /// Send a text message, or N sequenced messages of a given size.
    Send(send::SendArgs),
    /// Send one request and print its reply (exit code 1 and the reason if none came).
    Call(call::CallArgs),
    /// Show what a running node knows: its peers, their state, round trip, unacknowledged
    /// messages, and its counters (from the node's `--admin` address).
    Status(status::StatusArgs),
    /// Measure throughput over each transport beside the raw baseline of the same run.
    Bench(bench::BenchArgs),
    /// Check a node configuration file, or print a commented example.
    #[command(subcommand)]
    Config(config_cmd::ConfigCmd),
    /// Make the certificates of tls:// links: a cluster's authority, then one per node or
    /// relay, signed by it and naming its bus ids as busway checks them.
    #[command(
        subcommand,
        after_help = "Example:\n  \
            busway cert ca                # ca.pem, ca.key (valid 10 years)\n  \
            busway cert node --id 1       # 1.pem, 1.key (valid 1 year)\n  \
            busway cert relay --ids 100-199\n  \
            busway node --id 1 --listen tls://0.0.0.0:7443 --tls-cert 1.pem --tls-key 1.key --tls-ca ca.pem"
    )]
    Cert(cert::CertCmd),
    /// One side of one benchmark run (started by `busway bench`).
    #[command(hide = true)]
    BenchWorker(bench::worker::WorkerArgs),
    /// One process of a `busway bench --broadcast` run (started by `busway bench`).
    #[command(hide = true)]
    BenchBroadcastWorker(bench::broadcast_worker::BroadcastWorkerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut filter = tracing_subscriber::EnvFilter::try_from_env("BUSWAY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    if cli.log_format == LogFormat::Json {
        // Events, summaries and errors are log records too, whatever the level asked for.
        let say = format!("{}=info", say::TARGET)
            .parse()
            .expect("a valid directive");
        filter = filter.add_directive(say);
        say::use_json();
    }
    // Colour only for a person at a terminal: a file or a collector gets plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .with_env_filter(filter);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let result = match cli.command {
        Command::Node(args) => common::block_on(run_node(args)),
        Command::Listen(args) => common::block_on(listen::run(args)),
        Command::Send(args) => common::block_on(send::run(args)),
        Command::Call(args) => common::block_on(call::run(args)),
        Command::Status(args) => common::block_on(status::run(args)),
        Command::Bench(args) => bench::run(args),
        Command::Config(cmd) => config_cmd::run(cmd),
        Command::Cert(cmd) => cert::run(cmd),
        Command::BenchWorker(args) => bench::worker::run(args),
        Command::BenchBroadcastWorker(args) => bench::broadcast_worker::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            say::error(format_args!("busway: {e}"));
            ExitCode::from(1)
        }
    }
}

#[derive(clap::Args, Debug)]
struct NodeCmd {
    #[command(flatten)]
    node: common::NodeArgs,
    /// Serve the admin endpoint over HTTP on this address: `/` (status page), `/status.json`
    /// (what `busway status ADDR` reads) and `/metrics` (Prometheus); loopback or unix://
    /// only, unless `--insecure`.
    #[arg(long)]
    admin: Option<busway::Addr>,
}

async fn run_node(args: NodeCmd) -> Result<ExitCode, String> {
    if let Some(addr) = &args.admin {
        // The status page names every peer and counter: this host's only, unless told.
        if common::reachable_from_other_hosts(addr) {
            args.node.allow_insecure(
                &format!("serve status at {addr}"),
                "it names every peer and counter to any host that reaches it",
                "use a loopback or unix:// address",
            )?;
        }
    }
    // Before the node starts: a SIGTERM during the start stops it gracefully too.
    let stop = common::stop_requested();
    let node = args.node.start().await?;
    let mut events = node.take_events().expect("events are taken once");
    // A standalone node relays; messages addressed to it are counted and discarded (its
    // senders get their acknowledgements). `busway listen` is the node that reads them.
    drop(node.take_inbox());
    common::print_listening(&node);
    let _admin = match args.admin {
        Some(addr) => {
            let node = node.clone();
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(async move {
                let r = admin::serve(node, addr).await;
                let _ = ready_tx.send(r.clone());
                r
            });
            // A bind error ends the task at once; give it that moment to report.
            if let Ok(Ok(Err(e))) =
                tokio::time::timeout(std::time::Duration::from_millis(100), ready_rx).await
            {
                return Err(e);
            }
            Some(AbortOnDrop(task))
        }
        None => None,
    };
    // Made once: a signal between two events is not missed.
    tokio::pin!(stop);
    let mut refusals = Refusals::new(&args.node)?;
    loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(ev) => {
                    say::info(common::describe(&ev));
                    if let Some(why) = refusals.hopeless(&ev) {
                        node.shutdown().await;
                        return Err(why);
                    }
                }
                None => break,
            },
            _ = &mut stop => break,
        }
    }
    node.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// A peer this node dials that refuses its bus id in the handshake (the id is up there from
/// another process), try after try, for longer than the peer could take to find a dead holder
/// of the id gone (twice its heartbeat limit): `busway node` then exits non-zero rather than
/// redial for ever. Any other refusal, a link up meanwhile, or a pause between refusals longer
/// than the dialer's longest backoff starts the count again.
struct Refusals {
    /// When the current run of refusals began, and when the last one came.
    run: Option<(Instant, Instant)>,
    /// How long a run may last: twice the heartbeat limit (this node's, the same on every
    /// node of a cluster).
    patience: Duration,
    /// The addresses this node dials (`connect`, `upstream`), as events name them: a refused
    /// handshake elsewhere is a stranger's, refused by this node.
    dialed: Vec<String>,
}

/// Longest pause between two refusals of one run: past the dialer's longest backoff, the
/// refusals are not one run, in milliseconds.
const REFUSAL_RUN_GAP_MS: u64 = 2 * busway::limits::DIAL_BACKOFF_MAX_MS;

impl Refusals {
    fn new(args: &common::NodeArgs) -> Result<Self, String> {
        let config = args.config()?;
        let limit = config
            .heartbeat_interval_ms
            .saturating_mul(busway::limits::HEARTBEAT_MISSES_MAX);
        let dialed = (config.connect.iter())
            .chain(config.upstream.iter())
            .map(|a| a.to_string())
            .collect();
        Ok(Self {
            run: None,
            patience: Duration::from_millis(limit.saturating_mul(2)),
            dialed,
        })
    }

    /// Why the node should stop, if `ev` ends a run of refusals of its id past the patience.
    fn hopeless(&mut self, ev: &busway::Event) -> Option<String> {
        let (addr, why) = match ev {
            busway::Event::Rejected {
                addr,
                reason,
                kind: busway::Rejection::IdInUse,
                ..
            } if self.dialed.contains(addr) => (addr, reason),
            busway::Event::PeerUp { .. } | busway::Event::Rejected { .. } => {
                self.run = None;
                return None;
            }
            _ => return None,
        };
        let now = Instant::now();
        let gap = Duration::from_millis(REFUSAL_RUN_GAP_MS);
        let (began, _) = match self.run {
            Some((began, last)) if now - last <= gap => (began, last),
            _ => (now, now),
        };
        self.run = Some((began, now));
        let lasted = now - began;
        (lasted >= self.patience).then(|| {
            format!(
                "{addr} has refused this node's bus id for {} ms: {why}",
                lasted.as_millis()
            )
        })
    }
}

/// Stops a background task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
