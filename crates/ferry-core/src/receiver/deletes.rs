//! `--delete` during the list: with a sender that announced one walk
//! ([`ferry_link::features::SUBTREES`]), a directory's entries have all
//! come once the list leaves its subtree ([`decide::subtree_step`]); what
//! the destination holds there beyond them is deleted then, beside the
//! transfers, as rsync's `--delete-during` does. The [`unlink`] workers
//! live for the session. What is left (the root, what was still open at
//! the end of the list, every directory when the sender made no such
//! promise or `--max-delete` must spend its limit in rsync's order, and
//! the directories where work in progress was held back) is deleted at the
//! end ([`Dispatcher::finish`]).
//!
//! A directory whose listing was cut short is never cleared: the sender
//! reports an entry it cannot list before it lists anything after it, so
//! that directory ends after the report, and from a report on nothing
//! more is deleted (unless `--ignore-errors`). A file that is listed but
//! cannot be read is reported later, when it is read: the directories the
//! list had left by then have lost their extras (what the source does not
//! have; the unreadable file's own copy stays), as with rsync's
//! `--delete-during`. Work in progress in an ended directory (this run's
//! temporary files, the partial file of a listed file that may still be
//! arriving) is held back ([`decide::in_use`]). A sender that lists an
//! entry in a directory it has already left, or a directory twice, breaks
//! its promise: a protocol error.

use super::*;

/// What `--delete` still allows.
pub(super) struct DeleteBudget {
    /// Deletions left (`None`: no limit).
    pub(super) left: Option<u64>,
    /// Entries not deleted because the limit was reached.
    pub(super) skipped: u64,
}

impl DeleteBudget {
    /// Spend one deletion; `false` when none is left.
    pub(super) fn take(&mut self) -> bool {
        match &mut self.left {
            None => true,
            Some(0) => false,
            Some(n) => {
                *n -= 1;
                true
            }
        }
    }
}

/// The receiver's `--delete` for one session.
pub(super) struct Deletes {
    pub(super) budget: DeleteBudget,
    pub(super) unlinks: unlink::Unlinks,
    /// While streaming: the directories the list is in, outermost first.
    open: Option<Vec<Vec<u8>>>,
    /// Directories whose extras were deleted when their entries ended.
    done: crate::pathset::PathSet,
    /// Of those, the ones where work in progress was held back: the end
    /// of the run looks again.
    again: crate::pathset::PathSet,
}

impl Deletes {
    /// `streaming`: the sender lists one walk and no `--max-delete` limit
    /// needs rsync's order across directories.
    pub(super) fn new(unlinks: unlink::Unlinks, max_delete: Option<u64>, streaming: bool) -> Self {
        Deletes {
            budget: DeleteBudget {
                left: max_delete,
                skipped: 0,
            },
            unlinks,
            open: (streaming && max_delete.is_none()).then(Vec::new),
            done: Default::default(),
            again: Default::default(),
        }
    }

    /// Whether any directory's extras went during the list.
    pub(super) fn streamed(&self) -> bool {
        !self.done.is_empty()
    }

    /// Whether the end of the run deletes in the directory `rel`.
    pub(super) fn left_for_end(&self, rel: &[u8]) -> bool {
        !self.done.contains(rel) || self.again.contains(rel)
    }
}

impl Dispatcher<'_, '_> {
    /// The list's next entry, `path`: delete the extras of the
    /// directories whose entries it ends.
    pub(super) fn subtree(&mut self, path: &[u8], is_dir: bool) -> Result<()> {
        let Some(mut d) = self.deletes.take() else {
            return Ok(());
        };
        let r = self.subtree_in(&mut d, path, is_dir);
        self.deletes = Some(d);
        r
    }

    fn subtree_in(&mut self, d: &mut Deletes, path: &[u8], is_dir: bool) -> Result<()> {
        let Some(open) = d.open.as_mut() else {
            return Ok(());
        };
        if is_dir && !path.is_empty() && d.done.contains(path) {
            return Err(Error::Protocol(format!(
                "{}: directory listed again after its entries ended (the sender announced one walk)",
                shown(path)
            )));
        }
        let ended = decide::subtree_step(open, path, is_dir).map_err(Error::Protocol)?;
        let opts = self.sh.opts;
        for dir in ended {
            // After a source entry could not be read, nothing more goes
            // (the end of the run says so).
            if decide::deletion(true, self.source_unread, opts.ignore_errors)
                != decide::Deletion::Run
            {
                continue;
            }
            d.done.insert(&dir);
            if self.delete_extras(&dir, &mut d.budget, &d.unlinks, true) {
                d.again.insert(&dir);
            }
        }
        Ok(())
    }
}

/// Start the unlink workers for a session with `--delete` in `s`.
pub(super) fn start<'scope>(
    s: &'scope std::thread::Scope<'scope, '_>,
    stats: &'scope Stats,
    max_delete: Option<u64>,
    streaming: bool,
) -> Deletes {
    let progress = Arc::new(unlink::Progress::default());
    let (unlinks, rx) = unlink::Unlinks::new(progress.clone());
    for _ in 0..unlink::THREADS {
        let (p, rx) = (progress.clone(), rx.clone());
        s.spawn(move || p.work(rx, stats));
    }
    // Only the workers hold the queue: were they all gone, a send would
    // fail (and the caller unlink) instead of waiting for room.
    drop(rx);
    Deletes::new(unlinks, max_delete, streaming)
}
