//! Where a peer's link stands, as one value: down (since which detach), dead (down past its
//! deadline, since when), or up (which link, over a socket or a ring, closed by the peer, a cut
//! asked for). Every transition is a method here, each checking on entry (in debug builds) that
//! it starts from a state it may start from; `Peer` calls them under its lock.

/// What a link's messages go through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Carrier {
    /// The link's socket.
    Socket,
    /// The shared-memory ring the link switched to.
    Ring,
}

/// A link that is up.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct UpLink {
    /// The link's id (from 1).
    pub(crate) link: u64,
    pub(crate) over: Carrier,
    /// The peer sent CLOSE: the writer drains what is queued, answers CLOSE and finishes; the
    /// peer's reader frees no more room in a ring.
    pub(crate) closed_by_peer: bool,
    /// A cut asked for and not yet taken by the link's task: `Node::disconnect` (`None`) or a
    /// lie the link carried (the reason).
    pub(crate) cut: Option<Option<String>>,
}

/// Where a peer's link stands.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    /// No link since the detach numbered `epoch` (0: never up). A deadline set at that detach
    /// gives up on the peer only if no link came since.
    Down { epoch: u64 },
    /// Down past its deadline since `since_ms` (the node's clock): sends to it fail at once
    /// until a link is up again.
    Dead { since_ms: u64 },
    /// A link is attached.
    Up(UpLink),
}

impl Slot {
    /// A peer never connected.
    pub(crate) fn new() -> Self {
        Slot::Down { epoch: 0 }
    }

    /// The attached link, if any.
    pub(crate) fn link(&self) -> Option<u64> {
        match self {
            Slot::Up(up) => Some(up.link),
            _ => None,
        }
    }

    pub(crate) fn is_up(&self) -> bool {
        matches!(self, Slot::Up(_))
    }

    /// Since when the peer is dead, if it is.
    pub(crate) fn dead_since_ms(&self) -> Option<u64> {
        match *self {
            Slot::Dead { since_ms } => Some(since_ms),
            _ => None,
        }
    }

    /// Whether the attached link's messages go through its ring.
    pub(crate) fn over_ring(&self) -> bool {
        matches!(
            self,
            Slot::Up(UpLink {
                over: Carrier::Ring,
                ..
            })
        )
    }

    /// Whether the attached link is closing because its peer sent CLOSE.
    pub(crate) fn closed_by_peer(&self) -> bool {
        matches!(
            self,
            Slot::Up(UpLink {
                closed_by_peer: true,
                ..
            })
        )
    }

    /// Down or dead -> up over the socket. False (and no change) if a link is up already.
    pub(crate) fn attach(&mut self, link: u64) -> bool {
        if self.is_up() {
            return false;
        }
        debug_assert!(link != 0, "link ids start at 1");
        *self = Slot::Up(UpLink {
            link,
            over: Carrier::Socket,
            closed_by_peer: false,
            cut: None,
        });
        true
    }

    /// Up on `link` -> down since detach `epoch`. False (and no change) if `link` is not the
    /// link attached.
    pub(crate) fn detach(&mut self, link: u64, epoch: u64) -> bool {
        if self.link() != Some(link) {
            return false;
        }
        *self = Slot::Down { epoch };
        true
    }

    /// Down since detach `epoch` -> dead since `now_ms`. False (and no change) if a link came
    /// back, or went down again, since that detach.
    pub(crate) fn expire(&mut self, epoch: u64, now_ms: u64) -> bool {
        if *self != (Slot::Down { epoch }) {
            return false;
        }
        *self = Slot::Dead { since_ms: now_ms };
        true
    }

    /// The attached link switched its messages to its ring.
    pub(crate) fn switch_to_ring(&mut self) {
        debug_assert!(
            matches!(
                self,
                Slot::Up(UpLink {
                    over: Carrier::Socket,
                    ..
                })
            ),
            "a switch to a ring from {self:?}"
        );
        if let Slot::Up(up) = self {
            up.over = Carrier::Ring;
        }
    }

    /// The attached link's ring ended (its messages, if any more, go by the socket).
    pub(crate) fn back_to_socket(&mut self) {
        if let Slot::Up(up) = self {
            up.over = Carrier::Socket;
        }
    }

    /// The peer sent CLOSE on the attached link.
    pub(crate) fn close_by_peer(&mut self) {
        debug_assert!(self.is_up(), "a CLOSE from the peer with no link up");
        if let Slot::Up(up) = self {
            up.closed_by_peer = true;
        }
    }

    /// Asks the attached link to drop (`why`: the lie that closes it, or `None` for
    /// `Node::disconnect`). The first reason stays: later lies on one link are the same
    /// liar's. False if no link is attached.
    pub(crate) fn cut(&mut self, why: Option<String>) -> bool {
        let Slot::Up(up) = self else {
            return false;
        };
        if !matches!(up.cut, Some(Some(_))) {
            up.cut = Some(why);
        }
        true
    }

    /// The cut asked of `link`, taken (its reason inside), if one was asked of that link.
    pub(crate) fn take_cut(&mut self, link: u64) -> Option<Option<String>> {
        match self {
            Slot::Up(up) if up.link == link => up.cut.take(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_goes_up_down_and_dead_only_along_the_transitions() {
        let mut s = Slot::new();
        assert!(!s.expire(1, 10), "no detach 1 yet");
        assert!(s.attach(1));
        assert!(!s.attach(2), "one link at a time");
        assert!(!s.detach(2, 1), "only the attached link detaches");
        assert!(s.detach(1, 1));
        assert_eq!(s, Slot::Down { epoch: 1 });
        assert!(s.attach(3));
        assert!(s.detach(3, 2));
        assert!(!s.expire(1, 10), "a deadline of an earlier detach");
        assert!(s.expire(2, 10));
        assert_eq!(s.dead_since_ms(), Some(10));
        assert!(s.attach(4), "a dead peer comes back");
        assert_eq!(s.dead_since_ms(), None);
    }

    #[test]
    fn rings_cuts_and_closes_belong_to_the_link_up() {
        let mut s = Slot::new();
        assert!(!s.cut(None), "no link to cut");
        assert!(s.attach(1));
        s.switch_to_ring();
        assert!(s.over_ring());
        assert!(s.cut(Some("a lie".into())));
        assert!(s.cut(None));
        assert_eq!(s.take_cut(2), None, "asked of link 1, not 2");
        assert_eq!(
            s.take_cut(1),
            Some(Some("a lie".into())),
            "the first reason stays"
        );
        assert_eq!(s.take_cut(1), None, "taken once");
        s.close_by_peer();
        assert!(s.closed_by_peer());
        assert!(s.detach(1, 1));
        assert!(!s.over_ring() && !s.closed_by_peer());
        assert!(s.attach(2));
        assert!(!s.over_ring(), "a new link starts on its socket");
    }
}
