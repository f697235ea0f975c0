//! The CHANNEL frame: moving a link's data from its socket to a shared-memory ring, between two
//! nodes on one host that both advertised capability `shm`. Each side offers the ring it will
//! write (one ring per direction); the socket stays as the control link.
//!
//! ```text
//! u8 op, then:
//!   1 OFFER   u32 pid, u32 fd, u64 inode, u64 capacity,  the sender's ring toward the receiver,
//!             u64 token                                  opened as /proc/PID/fd/FD (or passed
//!                                                       with SCM_RIGHTS on a Unix link); the
//!                                                       ring's header must carry `token`, the
//!                                                       sender's id as writer and the
//!                                                       receiver's as reader
//!   2 ACCEPT  (nothing)                                  the receiver mapped it
//!   3 REFUSE  UTF-8 reason                               it could not; data stays on the socket
//!   4 SWITCH  (nothing)                                  the sender's last data on the socket:
//!                                                       what follows is in the ring
//! ```
//!
//! A receiver reads the ring only after it read SWITCH on the socket, so order holds across
//! the switch.

use crate::frame::{frame_bytes, FrameKind};
use bytes::Bytes;

/// Longest REFUSE reason, in bytes; longer ones are cut at a char boundary.
pub const REFUSE_REASON_LEN_MAX: usize = 256;

/// One CHANNEL message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Channel {
    /// The sender offers the ring it will write toward the receiver.
    Offer {
        /// The sender's process id, for opening the ring as `/proc/PID/fd/FD`.
        pid: u32,
        /// The ring's file descriptor number in the sender's process.
        fd: u32,
        /// The ring file's inode number, which the receiver checks on the file it opened.
        inode: u64,
        /// How many bytes of data the ring holds.
        capacity: u64,
        /// A random number the offerer wrote in the ring's header and tells only this peer.
        token: u64,
    },
    /// The receiver mapped the offered ring.
    Accept,
    /// The receiver could not map the ring, with the reason as UTF-8; data stays on the socket.
    Refuse(String),
    /// The sender's last data on the socket: what follows is in the ring.
    Switch,
}

impl Channel {
    /// The whole CHANNEL frame.
    pub fn frame(&self) -> Bytes {
        let mut body = Vec::new();
        match self {
            Self::Offer {
                pid,
                fd,
                inode,
                capacity,
                token,
            } => {
                body.push(1);
                body.extend_from_slice(&pid.to_le_bytes());
                body.extend_from_slice(&fd.to_le_bytes());
                body.extend_from_slice(&inode.to_le_bytes());
                body.extend_from_slice(&capacity.to_le_bytes());
                body.extend_from_slice(&token.to_le_bytes());
            }
            Self::Accept => body.push(2),
            Self::Refuse(reason) => {
                let mut cut = reason.len().min(REFUSE_REASON_LEN_MAX);
                while !reason.is_char_boundary(cut) {
                    cut -= 1;
                }
                body.push(3);
                body.extend_from_slice(&reason.as_bytes()[..cut]);
            }
            Self::Switch => body.push(4),
        }
        frame_bytes(FrameKind::Channel, &body)
    }

    /// Reads a CHANNEL body; an error names what is wrong.
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        let (&op, rest) = body
            .split_first()
            .ok_or_else(|| "empty CHANNEL body".to_string())?;
        let exact = |n: usize| {
            if rest.len() == n {
                Ok(())
            } else {
                Err(format!(
                    "CHANNEL op {op} with {} bytes, expected {n}",
                    rest.len()
                ))
            }
        };
        let u32_at = |i: usize| u32::from_le_bytes(rest[i..i + 4].try_into().unwrap_or_default());
        let u64_at = |i: usize| u64::from_le_bytes(rest[i..i + 8].try_into().unwrap_or_default());
        match op {
            1 => {
                exact(32)?;
                Ok(Self::Offer {
                    pid: u32_at(0),
                    fd: u32_at(4),
                    inode: u64_at(8),
                    capacity: u64_at(16),
                    token: u64_at(24),
                })
            }
            2 => exact(0).map(|_| Self::Accept),
            3 => Ok(Self::Refuse(String::from_utf8_lossy(rest).into_owned())),
            4 => exact(0).map(|_| Self::Switch),
            _ => Err(format!("CHANNEL op {op} unknown")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::HEADER_LEN;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn messages_round_trip(pid: u32, fd: u32, inode: u64, capacity: u64, token: u64, reason in ".{0,300}") {
            for m in [
                Channel::Offer { pid, fd, inode, capacity, token },
                Channel::Accept,
                Channel::Switch,
            ] {
                let f = m.frame();
                prop_assert_eq!(Channel::decode(&f[HEADER_LEN..]).unwrap(), m);
            }
            let f = Channel::Refuse(reason.clone()).frame();
            let Channel::Refuse(back) = Channel::decode(&f[HEADER_LEN..]).unwrap() else {
                panic!("not a refusal");
            };
            prop_assert!(reason.starts_with(&back) && back.len() <= REFUSE_REASON_LEN_MAX);
        }

        #[test]
        fn garbage_is_an_error_never_a_panic(body in prop::collection::vec(any::<u8>(), 0..40)) {
            let _ = Channel::decode(&body);
        }
    }

    #[test]
    fn bad_bodies_are_named() {
        assert!(Channel::decode(&[]).unwrap_err().contains("empty"));
        assert!(Channel::decode(&[1, 0])
            .unwrap_err()
            .contains("expected 32"));
        assert!(Channel::decode(&[9]).unwrap_err().contains("op 9 unknown"));
    }
}
