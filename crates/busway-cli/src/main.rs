//! `busway`: run a node, send and listen from a shell, and benchmark the bus.

mod bench;
mod common;
mod listen;
mod send;
mod verify;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "busway",
    version,
    about = "A brokerless message bus for backend server processes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node until Ctrl-C (a standalone relay/hub), logging its peers.
    Node(common::NodeArgs),
    /// Receive messages and print them (or check their sequence numbers with --verify).
    Listen(listen::ListenArgs),
    /// Send a text message, or N sequenced messages of a given size.
    Send(send::SendArgs),
    /// Measure throughput over each transport beside the raw baseline of the same run.
    Bench(bench::BenchArgs),
    /// One side of one benchmark run (started by `busway bench`).
    #[command(hide = true)]
    BenchWorker(bench::worker::WorkerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BUSWAY_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let result = match cli.command {
        Command::Node(args) => common::block_on(run_node(args)),
        Command::Listen(args) => common::block_on(listen::run(args)),
        Command::Send(args) => common::block_on(send::run(args)),
        Command::Bench(args) => bench::run(args),
        Command::BenchWorker(args) => bench::worker::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("busway: {e}");
            ExitCode::from(1)
        }
    }
}

async fn run_node(args: common::NodeArgs) -> Result<ExitCode, String> {
    let node = args.start().await?;
    let mut events = node.take_events().expect("events are taken once");
    common::print_listening(&node);
    loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(ev) => eprintln!("{}", common::describe(&ev)),
                None => break,
            },
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    node.shutdown().await;
    Ok(ExitCode::SUCCESS)
}
