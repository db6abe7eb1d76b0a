//! What the dispatcher tells the sender (`Want`, `Have`), handed over a
//! few at a time: sent one by one, each woke the sender's request thread,
//! which took it and slept again (10,000 small files: about one futex
//! wake on this side and one wait on that side per file).
//!
//! Held messages go out, in order, once [`HELD_MAX`] wait, and before the
//! dispatcher could wait: before it blocks for the sender's next message
//! (see [`ferry_link::MsgRx::ready`]) or on a full writer queue, and
//! before it queues work for the signer thread, whose `Decided` and
//! `EndOfList` must not pass a `Want` the dispatcher made before them.
//! A link that fails in a hand-over made on the way ([`Outbox::push`])
//! keeps its error for the dispatcher's next look ([`Outbox::check`]), so
//! the run ends with the link's own error (a retry can help), not with
//! what its loss did later.

use std::cell::RefCell;

use ferry_link::{LinkError, Message, MsgTx};

/// Messages held at most.
pub(super) const HELD_MAX: usize = 16;

pub(super) struct Outbox<'a> {
    tx: &'a MsgTx,
    held: RefCell<Vec<Message>>,
    /// Why a hand-over failed, until the dispatcher looks.
    failed: RefCell<Option<LinkError>>,
}

impl<'a> Outbox<'a> {
    pub(super) fn new(tx: &'a MsgTx) -> Outbox<'a> {
        Outbox {
            tx,
            held: RefCell::new(Vec::with_capacity(HELD_MAX)),
            failed: RefCell::new(None),
        }
    }

    /// Queue `m`, a control message (never data: that is compressed by
    /// [`MsgTx::send`]), behind those held.
    pub(super) fn send(&self, m: Message) -> Result<(), LinkError> {
        debug_assert!(!matches!(m, Message::Data { .. }));
        let full = {
            let mut held = self.held.borrow_mut();
            held.push(m);
            held.len() >= HELD_MAX
        };
        if full {
            self.flush()?;
        }
        Ok(())
    }

    /// Hand what is held to the link; the error of a failed hand-over,
    /// this one's or an earlier one's.
    pub(super) fn flush(&self) -> Result<(), LinkError> {
        self.check()?;
        let held = std::mem::take(&mut *self.held.borrow_mut());
        self.tx.send_batch(held).inspect_err(|e| {
            *self.failed.borrow_mut() = Some(e.clone());
        })
    }

    /// [`Outbox::flush`] where its error cannot be returned: it is kept
    /// for [`Outbox::check`].
    pub(super) fn push(&self) {
        let _ = self.flush();
    }

    /// The error of a failed hand-over, if any.
    pub(super) fn check(&self) -> Result<(), LinkError> {
        match &*self.failed.borrow() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_link::WantMode;

    fn want(file: u32) -> Message {
        Message::Want {
            file,
            mode: WantMode::Whole,
        }
    }

    #[test]
    fn held_until_flushed_or_full_then_in_order() {
        let (a, b) = ferry_link::in_process();
        let out = Outbox::new(&a.tx);
        for f in 0..3 {
            out.send(want(f)).unwrap();
        }
        assert!(!b.rx.ready(), "held, not sent");
        out.flush().unwrap();
        for f in 0..3 {
            assert_eq!(b.rx.recv().unwrap(), want(f));
        }
        // Nothing held: a flush sends nothing.
        out.flush().unwrap();
        assert!(!b.rx.ready());
        for f in 0..HELD_MAX as u32 {
            assert!(!b.rx.ready(), "sent before {HELD_MAX} were held");
            out.send(want(f)).unwrap();
        }
        for f in 0..HELD_MAX as u32 {
            assert_eq!(b.rx.recv().unwrap(), want(f));
        }
        assert!(!b.rx.ready());
    }

    #[test]
    fn a_failed_hand_over_is_kept_for_the_next_look() {
        let (a, b) = ferry_link::in_process();
        let out = Outbox::new(&a.tx);
        out.send(want(1)).unwrap();
        assert_eq!(out.check(), Ok(()));
        drop(b);
        out.push();
        assert_eq!(out.check(), Err(LinkError::Closed));
        assert_eq!(out.flush(), Err(LinkError::Closed));
        assert_eq!(out.send(want(2)), Ok(()), "held, not handed over yet");
    }
}
