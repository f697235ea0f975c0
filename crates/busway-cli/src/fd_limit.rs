//! The process's open-file limit: a node holds a descriptor per connection (and a few per
//! shared-memory link), so it raises its soft limit to the hard limit at start, and its status
//! says how many connections that leaves room for.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Descriptors a node keeps beside its connections (listeners, the runtime's event loops,
/// standard streams, log files), subtracted from the limit in [`connections_allowed`].
pub(crate) const FDS_RESERVED: u64 = 64;

/// Raises the soft open-file limit to the hard limit; returns the limit now in force (`None`:
/// unlimited).
pub(crate) fn raise() -> Option<u64> {
    let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
    if current != maximum {
        let raised = Rlimit {
            current: maximum,
            maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "could not raise the open-file limit to its hard limit");
        }
    }
    current_limit()
}

/// The soft open-file limit in force (`None`: unlimited).
pub(crate) fn current_limit() -> Option<u64> {
    getrlimit(Resource::Nofile).current
}

/// How many connections the open-file limit leaves room for, within `connections_max`.
pub(crate) fn connections_allowed(connections_max: usize) -> u64 {
    let by_files = current_limit().map_or(u64::MAX, |n| n.saturating_sub(FDS_RESERVED));
    by_files.min(connections_max as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_limit() {
        let hard = getrlimit(Resource::Nofile).maximum;
        if let Some(hard) = hard {
            // Lowered first, so that the raise is seen.
            let lower = Rlimit {
                current: Some(hard - 1),
                maximum: Some(hard),
            };
            setrlimit(Resource::Nofile, lower).unwrap();
            assert_eq!(current_limit(), Some(hard - 1));
        }
        assert_eq!(raise(), hard);
        assert!(connections_allowed(10) <= 10);
    }
}
