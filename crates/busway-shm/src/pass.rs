//! Handing a segment to the peer: its descriptor over a connected Unix socket (`SCM_RIGHTS`),
//! with a short tag that says what it is for (e.g. which direction of which link).

use crate::segment::Segment;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::AsFd;

/// Longest tag sent with a segment, in bytes.
pub const TAG_LEN_MAX: usize = 256;

/// Sends `segment`'s descriptor and `tag` (at most `TAG_LEN_MAX` bytes) in one message.
pub fn send_segment(sock: impl AsFd, segment: &Segment, tag: &[u8]) -> io::Result<()> {
    if tag.is_empty() || tag.len() > TAG_LEN_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "segment tag of {} bytes; it must be 1..={TAG_LEN_MAX}",
                tag.len()
            ),
        ));
    }
    let fds = [segment.fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other(
            "no room for the descriptor in the control buffer",
        ));
    }
    let sent = rustix::net::sendmsg(
        sock,
        &[IoSlice::new(tag)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent != tag.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("sent {sent} of {} tag bytes with the segment", tag.len()),
        ));
    }
    Ok(())
}

/// Receives a segment sent by [`send_segment`] and its tag. Errors name what was missing.
pub fn recv_segment(sock: impl AsFd) -> io::Result<(Segment, Vec<u8>)> {
    let mut tag = vec![0u8; TAG_LEN_MAX];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        sock,
        &mut [IoSliceMut::new(&mut tag)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    if got.bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the peer closed the socket instead of sending a segment",
        ));
    }
    tag.truncate(got.bytes);
    let mut fd = None;
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = msg {
            for f in fds {
                // More than one descriptor is not ours to keep: extra ones are closed here.
                fd.get_or_insert(f);
            }
        }
    }
    let fd = fd.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "a message without a segment descriptor",
        )
    })?;
    Ok((Segment::from_fd(fd)?, tag))
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;
    use crate::ring::Ring;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_ring_crosses_a_unix_socket_and_carries_records() {
        let (a, b) = UnixStream::pair().unwrap();
        let ring = Ring::create("busway-pass", 4096).unwrap();
        send_segment(&a, ring.segment(), b"link 7 a->b").unwrap();
        let (segment, tag) = recv_segment(&b).unwrap();
        assert_eq!(tag, b"link 7 a->b");
        let far = Ring::open(segment, &Default::default(), usize::MAX).unwrap();
        let mut p = ring.producer();
        p.try_push(b"through shared memory").unwrap();
        p.publish();
        let mut got = Vec::new();
        far.consumer()
            .unwrap()
            .read(1, |m| got = m.to_vec())
            .unwrap();
        assert_eq!(got, b"through shared memory");
    }

    #[test]
    fn a_message_without_a_descriptor_is_named() {
        let (a, b) = UnixStream::pair().unwrap();
        std::io::Write::write_all(&mut &a, b"just bytes").unwrap();
        let err = recv_segment(&b).err().unwrap();
        assert!(err.to_string().contains("without a segment"), "{err}");
        drop(a);
        let err = recv_segment(&b).err().unwrap();
        assert!(err.to_string().contains("closed"), "{err}");
    }
}
