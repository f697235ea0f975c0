//! Shared memory that cleans up after itself: a `memfd` (no name in `/dev/shm`, gone when the
//! last process holding its descriptor or a mapping of it exits, however it exits), mapped
//! read-write. The creator passes the descriptor to its peer (e.g. over a Unix socket with
//! `SCM_RIGHTS`); the peer maps it with [`Segment::from_fd`].

use memmap2::MmapRaw;
use rustix::fs::{MemfdFlags, SealFlags};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// Largest segment this crate maps, in bytes.
pub const SEGMENT_BYTES_MAX: usize = 1 << 30;

/// A mapped shared-memory segment.
pub struct Segment {
    file: File,
    map: MmapRaw,
}

impl Segment {
    /// A new zeroed segment of `len` bytes; `name` shows in `/proc/PID/fd` (debugging only).
    pub fn create(name: &str, len: usize) -> io::Result<Self> {
        if len == 0 || len > SEGMENT_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("segment of {len} bytes; it must be 1..={SEGMENT_BYTES_MAX}"),
            ));
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        // The size can no longer change: a peer cannot shrink it under our mapping (SIGBUS).
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        Self::map(fd)
    }

    /// Maps a segment received from a peer. Errors if it is empty, too large, or could still
    /// shrink (a peer could then make our reads fault).
    pub fn from_fd(fd: OwnedFd) -> io::Result<Self> {
        let seals = rustix::fs::fcntl_get_seals(&fd)?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "shared-memory segment is not sealed against shrinking",
            ));
        }
        Self::map(fd)
    }

    /// Like [`Segment::open_from_process`], mapped read-only: for a segment this side only
    /// reads and others read too (a group's log), so that no bug here can change what they
    /// read. Writing through [`Segment::as_ptr`] of such a segment faults.
    pub fn open_read_only_from_process(pid: u32, fd: u32, inode: u64) -> io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = format!("/proc/{pid}/fd/{fd}");
        // Non-blocking: a peer naming a FIFO without a writer must not hang this open.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags((rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY).bits() as i32)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("opening {path}: {e}")))?;
        let stat = rustix::fs::fstat(&file)?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path} is not a shared-memory segment (not a regular file)"),
            ));
        }
        let found = stat.st_ino;
        if found != inode {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path} is inode {found}, not the announced segment {inode}"),
            ));
        }
        let seals = rustix::fs::fcntl_get_seals(&file)?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "shared-memory segment is not sealed against shrinking",
            ));
        }
        let len = Self::checked_len(&file)?;
        let map = memmap2::MmapOptions::new()
            .len(len)
            .map_raw_read_only(&file)?;
        Ok(Self { file, map })
    }

    /// Opens the segment that process `pid` holds as descriptor `fd`, through
    /// `/proc/PID/fd/FD`: how a node reaches a segment of a peer on the same host when their
    /// link is TCP (no descriptor passing). Needs the same user (the kernel checks it) and
    /// `inode` as the peer announced it, so that a recycled pid or descriptor number cannot
    /// hand us another file.
    pub fn open_from_process(pid: u32, fd: u32, inode: u64) -> io::Result<Self> {
        let path = format!("/proc/{pid}/fd/{fd}");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("opening {path}: {e}")))?;
        let found = rustix::fs::fstat(&file)?.st_ino;
        if found != inode {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path} is inode {found}, not the announced segment {inode}"),
            ));
        }
        Self::from_fd(OwnedFd::from(file))
    }

    /// The inode of the segment's file, to announce with [`Segment::open_from_process`].
    pub fn inode(&self) -> io::Result<u64> {
        Ok(rustix::fs::fstat(&self.file)?.st_ino)
    }

    fn map(fd: OwnedFd) -> io::Result<Self> {
        let file = File::from(fd);
        Self::checked_len(&file)?;
        let map = MmapRaw::map_raw(&file)?;
        Ok(Self { file, map })
    }

    /// The file's length, if a segment may have it.
    fn checked_len(file: &File) -> io::Result<usize> {
        let len = file.metadata()?.len();
        if len == 0 || len > SEGMENT_BYTES_MAX as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("shared-memory segment of {len} bytes; expected 1..={SEGMENT_BYTES_MAX}"),
            ));
        }
        Ok(len as usize)
    }

    /// The segment's descriptor, to pass to the peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The start of the mapping (page-aligned); valid for `len()` bytes while `self` lives.
    #[cfg_attr(feature = "loom", allow(dead_code))]
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }
}
