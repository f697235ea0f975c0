//! What an application's group call is refused for before anything is sent: a bad name, a
//! publish that does not fit a frame, a node shutting down.

use super::{check_name, PUBLISH_FIXED_BYTES};

/// Why a group call failed; nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupError {
    /// The name is empty, too long, or the node joined too many groups; the text says which.
    BadName(String),
    /// The payload and the PUBLISH head do not fit one frame.
    TooLarge {
        /// The payload's length, in bytes.
        len: usize,
        /// The longest payload a publish to this group may carry, in bytes.
        max: usize,
    },
    /// The node is shutting down.
    Closed,
}

impl std::fmt::Display for GroupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupError::BadName(why) => write!(f, "{why}"),
            GroupError::TooLarge { len, max } => write!(
                f,
                "a publish of {len} bytes to this group does not fit a frame (at most {max})"
            ),
            GroupError::Closed => write!(f, "the node is shutting down"),
        }
    }
}

impl std::error::Error for GroupError {}

impl GroupError {
    /// What kind of failure this is.
    pub fn kind(&self) -> crate::error_kind::ErrorKind {
        use crate::error_kind::ErrorKind;
        match self {
            GroupError::BadName(_) => ErrorKind::BadArgument,
            GroupError::TooLarge { .. } => ErrorKind::TooLarge,
            GroupError::Closed => ErrorKind::Closed,
        }
    }
}

/// Checks a publish of `payload_len` bytes to `group` against a frame body of at most
/// `frame_max` bytes; returns the PUBLISH body's length.
pub fn check_publish(
    group: &str,
    payload_len: usize,
    frame_max: usize,
) -> Result<usize, GroupError> {
    check_name(group).map_err(GroupError::BadName)?;
    let head = PUBLISH_FIXED_BYTES + group.len();
    if head + payload_len > frame_max {
        return Err(GroupError::TooLarge {
            len: payload_len,
            max: frame_max.saturating_sub(head),
        });
    }
    Ok(head + payload_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_is_checked_for_its_name_and_its_frame() {
        assert_eq!(check_publish("g", 10, 100), Ok(PUBLISH_FIXED_BYTES + 11));
        let max = 100 - PUBLISH_FIXED_BYTES - 1;
        assert_eq!(check_publish("g", max, 100), Ok(100));
        assert_eq!(
            check_publish("g", max + 1, 100),
            Err(GroupError::TooLarge { len: max + 1, max })
        );
        let err = check_publish("", 1, 100).unwrap_err();
        assert!(err.to_string().contains("group name of 0 bytes"), "{err}");
    }
}
