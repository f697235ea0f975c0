//! Where a node finds etcd and how it registers there (`NodeConfig::etcd`, the `[etcd]`
//! table of a config file); `discovery` does the registering and the finding.

/// Where a node finds etcd and how it registers there (`NodeConfig::etcd`; the `[etcd]`
/// table of a config file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// etcd's client URLs, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Key prefix of this bus's registrations (several buses may share one etcd).
    pub prefix: String,
    /// Lease of the registration, in seconds: a node that dies without a word disappears
    /// from the others' view this long after its last keep-alive.
    pub lease_ttl_secs: u64,
}

/// Default key prefix.
pub const DEFAULT_ETCD_PREFIX: &str = "/busway";
/// Default lease of a registration, in seconds.
pub const DEFAULT_ETCD_LEASE_TTL_SECS: u64 = 10;
/// Shortest lease etcd grants reliably, in seconds.
pub const ETCD_LEASE_TTL_MIN_SECS: u64 = 2;

impl EtcdConfig {
    /// etcd at `endpoints`, with the default prefix and lease.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            prefix: DEFAULT_ETCD_PREFIX.to_owned(),
            lease_ttl_secs: DEFAULT_ETCD_LEASE_TTL_SECS,
        }
    }

    /// The first thing wrong with it, named.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.endpoints.is_empty() {
            return Err(
                "etcd.endpoints: at least one etcd URL (e.g. http://127.0.0.1:2379)".into(),
            );
        }
        if let Some(e) = self
            .endpoints
            .iter()
            .find(|e| !e.starts_with("http://") || e.len() < 8)
        {
            return Err(format!(
                "etcd.endpoints: {e:?} is not an etcd URL (http://HOST:PORT; https:// is not supported yet)"
            ));
        }
        if self.lease_ttl_secs < ETCD_LEASE_TTL_MIN_SECS {
            return Err(format!(
                "etcd.lease_ttl_secs: {} (at least {ETCD_LEASE_TTL_MIN_SECS})",
                self.lease_ttl_secs
            ));
        }
        Ok(())
    }

    pub(crate) fn nodes_prefix(&self) -> String {
        format!("{}/nodes/", self.prefix.trim_end_matches('/'))
    }
}
