//! Options and helpers shared by the subcommands.

use crate::link_wait::LinkWait;
use busway::{Addr, BusId, Event, Events, IoThreads, Node, NodeConfig, Secret};
use clap::Args;
use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

/// How long `send` and `call` wait for the link to their destination, in seconds.
const PEER_WAIT_SECS: u64 = 10;
/// How often `send --group` looks whether a member of its group is known yet.
const GROUP_POLL: Duration = Duration::from_millis(10);
/// How often `send` looks whether etcd named its destination yet.
const DISCOVERY_POLL: Duration = Duration::from_millis(10);

/// How a command's node is set up.
#[derive(Args, Clone, Debug)]
pub(crate) struct NodeArgs {
    /// A node configuration file (TOML; `busway config example` prints a commented one):
    /// every setting of the node; the flags below override it (a list given as a flag, e.g.
    /// --listen, replaces the file's list).
    #[arg(
        short = 'c',
        long = "config",
        value_name = "FILE",
        env = "BUSWAY_CONFIG"
    )]
    pub(crate) config_file: Option<std::path::PathBuf>,
    /// This node's bus id (decimal or 0x hex); required here or as `id` in the file.
    #[arg(long, env = "BUSWAY_ID")]
    pub(crate) id: Option<BusId>,
    /// Address to listen on (repeatable): tcp://IP:PORT, tcp://[IPv6]:PORT, tls://IP:PORT (TCP
    /// with TLS; needs --tls-cert, --tls-key and --tls-ca), unix:///PATH, or shm://NAME (this
    /// host only; the link's data must go through shared memory).
    #[arg(long)]
    pub(crate) listen: Vec<Addr>,
    /// Address to dial and keep dialing (repeatable).
    #[arg(long)]
    pub(crate) connect: Vec<Addr>,
    /// This node's upstream (its parent, a relay): messages to ids with no other route go
    /// through it, and it routes messages for this node here.
    #[arg(long)]
    pub(crate) upstream: Option<Addr>,
    /// This node's upstream by bus id, found in etcd (needs --etcd or an [etcd] table): the
    /// relay registered under that id, at the first tcp:// or tls:// address it listens on.
    #[arg(long, conflicts_with = "upstream", value_name = "ID")]
    pub(crate) upstream_id: Option<BusId>,
    /// Keep all traffic on configured links: do not dial nodes a relay hints, and do not
    /// accept such direct links.
    #[arg(long)]
    pub(crate) no_direct: bool,
    /// Keep a link's data on its socket even when the peer runs on this host (by default it
    /// moves to shared-memory rings).
    #[arg(long)]
    pub(crate) no_shm: bool,
    /// Shared secret every peer must prove (at least 16 bytes); also read from BUSWAY_SECRET.
    /// Prefer `--secret-file` or the variable: a command line is visible to every user (`ps`).
    #[arg(long, env = "BUSWAY_SECRET", hide_env_values = true)]
    pub(crate) secret: Option<String>,
    /// File holding the shared secret (its trailing newline is not part of it).
    #[arg(long, conflicts_with = "secret")]
    pub(crate) secret_file: Option<std::path::PathBuf>,
    /// This node's TLS certificate chain (PEM) for tls:// links; its certificate must name the
    /// node's bus id as the DNS name ID.id.busway (or a range FIRST-LAST.ids.busway).
    #[arg(long, requires_all = ["tls_key", "tls_ca"])]
    pub(crate) tls_cert: Option<std::path::PathBuf>,
    /// The private key (PEM) of `--tls-cert`.
    #[arg(long, requires_all = ["tls_cert", "tls_ca"])]
    pub(crate) tls_key: Option<std::path::PathBuf>,
    /// The certificate authorities (PEM) whose certificates peers on tls:// links must present.
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    pub(crate) tls_ca: Option<std::path::PathBuf>,
    /// Listen on (and serve `--admin` at) addresses other hosts can reach with no shared secret:
    /// anyone who can reach them can join as any bus id. Refused without this flag.
    #[arg(long)]
    pub(crate) insecure: bool,
    /// After its start, for how long (ms) the node, as a relay, calls an id nobody registered
    /// "down for now" rather than unknown (its downstreams may not be back yet).
    #[arg(long)]
    pub(crate) relay_grace_ms: Option<u64>,
    /// I/O loop threads (default: one per core).
    #[arg(long)]
    pub(crate) io_threads: Option<usize>,
    /// Bytes of its recent publishes a publisher keeps per group to send members copies of
    /// what a dead relay lost (default 32 MiB).
    #[arg(long)]
    pub(crate) group_retain_bytes: Option<usize>,
    /// etcd's client URLs (comma-separated, e.g. http://127.0.0.1:2379): register this node
    /// there and find the nodes it has no link or route to (prefix and lease in the file's
    /// `[etcd]` table).
    #[arg(long, env = "BUSWAY_ETCD", value_delimiter = ',')]
    pub(crate) etcd: Vec<String>,
}

/// The address of the relay registered in etcd as `id` (waiting for it up to
/// `PEER_WAIT_SECS`): its first tcp:// or tls:// address, else its first.
async fn upstream_from_etcd(config: &NodeConfig, id: BusId) -> Result<Addr, String> {
    let etcd = config
        .etcd
        .as_ref()
        .ok_or("--upstream-id needs etcd: give --etcd URL (or an [etcd] table in the -c file)")?;
    let deadline = std::time::Instant::now() + Duration::from_secs(PEER_WAIT_SECS);
    loop {
        match etcd.lookup(id).await {
            Ok(Some(n)) => {
                let remote = |a: &&String| a.starts_with("tcp://") || a.starts_with("tls://");
                let addr = n
                    .addrs
                    .iter()
                    .find(remote)
                    .or(n.addrs.first())
                    .ok_or(format!(
                        "bus id {id} is registered in etcd with no address to dial"
                    ))?;
                return addr
                    .parse()
                    .map_err(|e| format!("bus id {id} registered {addr:?} in etcd: {e}"));
            }
            Ok(None) if std::time::Instant::now() < deadline => {}
            Ok(None) => {
                return Err(format!(
                    "bus id {id} is not registered in etcd (waited {PEER_WAIT_SECS} s)"
                ))
            }
            Err(e) => return Err(format!("cannot find the upstream {id}: {e}")),
        }
        tokio::time::sleep(DISCOVERY_POLL * 10).await;
    }
}

/// Waits until etcd names `to` (or a link to it is up), at most `wait`.
async fn wait_discovered(node: &Node, to: BusId, wait: Duration) -> bool {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let known = node
            .discovery()
            .is_some_and(|d| d.nodes.iter().any(|n| n.id == to));
        if known || node.peers().iter().any(|p| p.id == to && p.up) {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        // The directory fills from etcd's answers, not from events: look again shortly.
        tokio::time::sleep(DISCOVERY_POLL).await;
    }
}

impl NodeArgs {
    pub(crate) fn config(&self) -> Result<NodeConfig, String> {
        // The file, then BUSWAY_<KEY> variables over it, then the flags over both.
        let text = match &self.config_file {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
            None => String::new(),
        };
        let mut config = NodeConfig::from_toml_with_env(&text, std::env::vars()).map_err(|e| {
            match &self.config_file {
                Some(path) => format!("{}: {e}", path.display()),
                None => e.to_string(),
            }
        })?;
        match self.id {
            Some(id) => config.id = id,
            None if config.id != BusId(0) => {}
            None => return Err("give this node's bus id: --id ID (or `id` in the -c file)".into()),
        }
        if !self.listen.is_empty() {
            config.listen = self.listen.clone();
        }
        if !self.connect.is_empty() {
            config.connect = self.connect.clone();
        }
        if self.upstream.is_some() {
            config.upstream = self.upstream.clone();
        }
        if self.no_direct {
            config.direct_links = false;
        }
        if self.no_shm {
            config.shm_channels = false;
        }
        if let Some(secret) = self.secret()? {
            config.secret = Some(secret);
        }
        if let (Some(cert), Some(key), Some(ca)) = (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            config.tls = Some(busway::TlsConfig::from_pem_files(cert, key, ca)?);
        }
        if let Some(ms) = self.relay_grace_ms {
            config.relay_grace_ms = ms;
        }
        if let Some(n) = self.io_threads {
            config.io_threads = IoThreads::Dedicated(n);
        }
        if let Some(n) = self.group_retain_bytes {
            config.group_retain_bytes = n;
        }
        if !self.etcd.is_empty() {
            let mut etcd = config
                .etcd
                .take()
                .unwrap_or_else(|| busway::EtcdConfig::new(Vec::new()));
            etcd.endpoints = self.etcd.clone();
            config.etcd = Some(etcd);
        }
        needs_tls_flags(&config)?;
        config.validate()?;
        Ok(config)
    }

    /// The secret from `--secret`, BUSWAY_SECRET or `--secret-file`, if any.
    fn secret(&self) -> Result<Option<Secret>, String> {
        let text = match (&self.secret, &self.secret_file) {
            (Some(s), _) => s.clone(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read the secret file {}: {e}", path.display()))?
                .trim_end_matches(['\r', '\n'])
                .to_owned(),
            (None, None) => return Ok(None),
        };
        Secret::new(text.as_bytes()).map(Some)
    }

    /// Waits until `to` can be sent to from `node`: its link up, or (a node that only has an
    /// upstream) the upstream's. Reads `events` meanwhile: the error names why the link did
    /// not come up (a refused dial, a refused handshake, another id at the address) as soon
    /// as waiting cannot help, or after `PEER_WAIT_SECS`.
    pub(crate) async fn wait_reachable(
        &self,
        node: &Node,
        events: &mut Events,
        to: BusId,
    ) -> Result<(), String> {
        let wait = Duration::from_secs(PEER_WAIT_SECS);
        let config = self.config()?;
        let through_upstream = config.upstream.is_some() || self.upstream_id.is_some();
        let by_etcd = config.etcd.is_some() && config.connect.is_empty();
        let reachable = async {
            if through_upstream && config.connect.is_empty() {
                // Through the upstream: its link is what must be up.
                node.wait_for_any_link(wait).await
            } else if by_etcd {
                // Found through etcd: the first send dials it.
                wait_discovered(node, to, wait).await
            } else {
                node.wait_for_peer(to, wait).await
            }
        };
        let dialed: Vec<String> = (config.connect.iter())
            .chain(config.upstream.iter())
            .map(|a| a.to_string())
            .collect();
        let link = LinkWait {
            to,
            dialed: &dialed,
            through_others: through_upstream || by_etcd,
            wait_secs: PEER_WAIT_SECS,
        };
        link.run(events, reachable).await
    }

    /// Waits (as `wait_reachable` does) until `links` links of `node` lead to members of
    /// `group` (their peers asked for its publishes).
    pub(crate) async fn wait_for_group(
        &self,
        node: &Node,
        group: &str,
        links: usize,
    ) -> Result<(), String> {
        let wait = Duration::from_secs(PEER_WAIT_SECS);
        let deadline = std::time::Instant::now() + wait;
        while node.group_links(group).len() < links {
            if std::time::Instant::now() >= deadline {
                return Err(format!(
                    "{} of {links} links to members of group {group} were known after {PEER_WAIT_SECS} s",
                    node.group_links(group).len()
                ));
            }
            // Interest arrives as messages, not events: look again shortly.
            tokio::time::sleep(GROUP_POLL).await;
        }
        Ok(())
    }

    /// Checks a message size a flag asks for (`flag`: its name) against the node's frame
    /// limit, before anything of that size is made: an error names both.
    pub(crate) fn check_message_size(&self, flag: &str, size: usize) -> Result<(), String> {
        let max = self.config()?.frame_body_max;
        if size > max {
            return Err(format!(
                "{flag} {size} is over the {max}-byte frame limit (frame_body_max in the -c file)"
            ));
        }
        Ok(())
    }

    pub(crate) async fn start(&self) -> Result<Node, String> {
        let mut config = self.config()?;
        if let Some(id) = self.upstream_id {
            config.upstream = Some(upstream_from_etcd(&config, id).await?);
        }
        if config.listen.is_empty()
            && config.connect.is_empty()
            && config.upstream.is_none()
            && config.etcd.is_none()
        {
            return Err(
                "give at least one --listen, --connect, --upstream or --etcd address (or in the -c file)"
                    .into(),
            );
        }
        if config.secret.is_none() {
            for addr in config
                .listen
                .iter()
                .filter(|a| reachable_from_other_hosts(a))
            {
                self.allow_insecure(
                    &format!("listen on {addr} with no shared secret"),
                    "any host that reaches it can join as any bus id",
                    "give a secret (--secret-file FILE or BUSWAY_SECRET), listen on tls:// \
                     (with --tls-cert, --tls-key, --tls-ca), or listen on a loopback or unix:// \
                     address",
                )?;
            }
        }
        // A descriptor per connection: as many as the hard limit allows.
        crate::fd_limit::raise();
        Node::start(config).await.map_err(|e| e.to_string())
    }

    /// Whether `what` (something other hosts can reach, for the reason `risk`) may go ahead:
    /// refused without `--insecure`, with a warning with it.
    pub(crate) fn allow_insecure(
        &self,
        what: &str,
        risk: &str,
        instead: &str,
    ) -> Result<(), String> {
        if !self.insecure {
            return Err(format!(
                "refusing to {what}: {risk}; {instead}, or pass --insecure to accept that"
            ));
        }
        crate::say::warn(format_args!("busway: warning: {what} (--insecure): {risk}"));
        Ok(())
    }
}

/// A `tls://` address with no certificate is named with the flags that give one and the
/// command that makes them (the library's own check names `NodeConfig::tls`, which a user of
/// the command never sees).
fn needs_tls_flags(config: &NodeConfig) -> Result<(), String> {
    if config.tls.is_some() {
        return Ok(());
    }
    let tls = (config.listen.iter())
        .chain(&config.connect)
        .chain(&config.upstream)
        .find(|a| matches!(a, Addr::Tls(_) | Addr::TlsHost(_)));
    match tls {
        Some(addr) => Err(format!(
            "{addr} needs TLS: give this node's certificate, its key and the authority that \
             signed its peers' as --tls-cert FILE --tls-key FILE --tls-ca FILE (or a [tls] \
             table in the -c file); `busway cert ca` then `busway cert node --id {}` make them",
            config.id
        )),
        None => Ok(()),
    }
}

/// Whether other hosts can reach `addr` with no proof of who they are: a plain TCP address
/// that is not loopback (an unspecified one, 0.0.0.0 or [::], included), or a host name that
/// resolves to one. Unix and shm:// addresses are this host's only; a tls:// peer must present
/// a certificate of the cluster.
pub(crate) fn reachable_from_other_hosts(addr: &Addr) -> bool {
    use std::net::ToSocketAddrs;
    match addr {
        Addr::Tcp(sa) => !sa.ip().is_loopback(),
        // A name that does not resolve counts as reachable: the check fails closed.
        Addr::TcpHost(hp) => (hp.host(), hp.port())
            .to_socket_addrs()
            .map_or(true, |mut all| all.any(|sa| !sa.ip().is_loopback())),
        _ => false,
    }
}

/// Runs `f` on a single-threaded runtime (the node has its own I/O threads).
pub(crate) fn block_on<F: Future<Output = Result<ExitCode, String>>>(
    f: F,
) -> Result<ExitCode, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?
        .block_on(f)
}

/// Completes at the first SIGINT (Ctrl-C) or SIGTERM (what systemd and Kubernetes send), so
/// that the caller shuts its node down gracefully (queues flushed within the linger, CLOSE
/// sent, deregistered from etcd); from then on a second one ends the process at once (exit
/// code 1). The handlers are installed when this is called, not when the future is first
/// polled: call it before the node starts, so that a signal during the start is not the
/// default one (which kills the process on the spot).
pub(crate) fn stop_requested() -> impl Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(mut term), Ok(mut int)) = handlers else {
            // No handler could be set up: Ctrl-C still stops the node.
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        crate::say::info(
            "busway: stopping (flushing, then closing the links; a second signal stops at once)",
        );
        tokio::spawn(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            crate::say::warn("busway: second signal: stopping at once");
            std::process::exit(1);
        });
    }
}

/// Prints `listening on ADDR` for each bound address, on stdout, so scripts can read ports.
pub(crate) fn print_listening(node: &Node) {
    for addr in node.listen_addrs() {
        println!("listening on {addr}");
    }
}

/// One line for an event.
pub(crate) fn describe(ev: &Event) -> String {
    match ev {
        Event::PeerUp {
            peer,
            incarnation,
            addr,
        } => format!("peer {peer} up (incarnation {incarnation:#x}, {addr})"),
        Event::PeerDown {
            peer,
            reason,
            unacked,
        } => format!("peer {peer} down: {reason} ({unacked} unacknowledged, kept)"),
        Event::Undeliverable {
            peer,
            seqs,
            reason,
            path,
            incarnation,
        } => format!(
            "{} messages to {peer} not confirmed, given up (numbers {}..{} {path}{}; some may have arrived): {reason}",
            seqs.end - seqs.start,
            seqs.start,
            seqs.end,
            incarnation.map_or(String::new(), |i| format!(", incarnation {i:#x}"))
        ),
        Event::Rejected { addr, reason, .. } => format!("rejected {addr}: {reason}"),
        Event::DialFailed { addr, reason } => format!("dial {addr} failed: {reason} (retrying)"),
        Event::GroupGap {
            group,
            publisher,
            missed,
            reason,
        } => format!(
            "group {group}: {missed} publishes of {publisher} never arrived ({reason}); still a member"
        ),
        Event::GroupCutOff {
            group,
            publisher,
            missed,
            reason,
        } => format!(
            "cut off from group {group}: {missed} publishes of {publisher} missed ({reason}); \
             this member fell behind: its application left them unread"
        ),
        Event::MulticastGap {
            source,
            missed,
            reason,
        } => format!("{missed} multicasts of {source} never arrived ({reason})"),
        Event::MulticastUnreachable {
            receiver,
            number,
            relay,
            reason,
        } => format!("multicast {number} to {receiver} dropped at relay {relay}: {reason}"),
        Event::GroupRefused {
            group,
            by,
            publish,
            reason,
        } => format!(
            "bus id {by} refused this node's {} group {group}: {reason}",
            if *publish { "publishes to" } else { "join of" }
        ),
        // An event a newer library added (`Event` is non-exhaustive).
        other => format!("{other:?}"),
    }
}
