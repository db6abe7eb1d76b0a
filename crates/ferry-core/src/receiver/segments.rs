//! The data path from the dispatcher to the writers: each op routed to
//! the writer of its segment, and the segments the sender finishes
//! (`SegmentDone`, a run of `Holes`) tallied before their writer hears.

use super::*;

impl Dispatcher<'_, '_> {
    /// `SegmentDone`: the answer to a check, or the end of a segment.
    pub(super) fn segment_done(
        &mut self,
        workers: &[Sender<(Arc<DstFile>, Op)>],
        file: u32,
        segment: u32,
        digest: [u8; 32],
    ) -> Result<()> {
        if self.check_done(file, segment, digest)? {
            return Ok(());
        }
        let f = self.lookup(file)?;
        let last = self.finish_segments(file, &f, segment, 1, false)?;
        let k = worker_for(&f, segment as u64, workers.len());
        send_op(&workers[k], f, Op::Done(segment, digest), &self.tx)?;
        if last {
            self.admit()?;
        }
        Ok(())
    }

    /// `Holes`: a run of segments without data, finished at once.
    pub(super) fn holes(
        &mut self,
        workers: &[Sender<(Arc<DstFile>, Op)>],
        file: u32,
        first: u32,
        count: u32,
    ) -> Result<()> {
        if self.checks.contains_key(&file) {
            return Err(Error::Protocol(format!(
                "Holes for file {file}, which is being checked"
            )));
        }
        let f = self.lookup(file)?;
        let last = self.finish_segments(file, &f, first, count, true)?;
        readback::keep_holes(&f, first as u64, count as u64);
        // No segment of the run has state on any writer (none
        // got ops), and none can get any now: one writer
        // takes the whole run at once.
        let k = worker_for(&f, first as u64, workers.len());
        send_op(&workers[k], f, Op::Holes(first, count), &self.tx)?;
        if last {
            self.admit()?;
        }
        Ok(())
    }

    pub(super) fn lookup(&self, file: u32) -> Result<Arc<DstFile>> {
        self.files.get(&file).cloned().ok_or_else(|| {
            Error::Protocol(format!("data for file {file}, which was not requested"))
        })
    }

    /// The sender finished segments `first..first + count` of `file`:
    /// tally them (all or none); true when they were its last, and the
    /// file is then forgotten here (its writers finish it).
    fn finish_segments(
        &mut self,
        file: u32,
        f: &DstFile,
        first: u32,
        count: u32,
        holes: bool,
    ) -> Result<bool> {
        let tally = self
            .done
            .entry(file)
            .or_insert_with(|| decide::SegmentTally::new(f.nseg));
        let last = match tally.finish_run(first, count, holes) {
            Ok(last) => last,
            Err(decide::SegmentError::OutOfRange) => {
                return Err(Error::Protocol(format!(
                    "segments {first}..{} of file {file}, which has {}",
                    first as u64 + count as u64,
                    f.nseg
                )))
            }
            Err(decide::SegmentError::Twice) => {
                return Err(Error::Protocol(format!(
                    "segment {first} (of {count} from there) of file {file} finished twice"
                )))
            }
            Err(decide::SegmentError::Started) => {
                return Err(Error::Protocol(format!(
                    "holes over segments {first}..{} of file {file}, one of which got data",
                    first as u64 + count as u64
                )))
            }
        };
        if last {
            self.files.remove(&file);
            self.done.remove(&file);
        }
        Ok(last)
    }

    /// Hand a data op to the writer of its segment. An op must lie within
    /// one segment of the file as announced, of a segment not yet finished.
    pub(super) fn route(
        &mut self,
        workers: &[Sender<(Arc<DstFile>, Op)>],
        file: u32,
        offset: u64,
        len: u64,
        op: Op,
    ) -> Result<()> {
        if !self.check_op(file, offset, len)? {
            return Ok(());
        }
        let f = self.lookup(file)?;
        let seg = match decide::op_fit(offset, len, f.entry.size) {
            // Says nothing; harmless.
            decide::OpFit::Empty => return Ok(()),
            decide::OpFit::Segment(seg) => seg,
            decide::OpFit::Outside => {
                return Err(Error::Protocol(format!(
                    "{} bytes at offset {offset} of file {file} ({} bytes): not within one segment",
                    len, f.entry.size
                )))
            }
        };
        let tally = self
            .done
            .entry(file)
            .or_insert_with(|| decide::SegmentTally::new(f.nseg));
        // Segments are numbered in 32 bits on the wire: one past that
        // could never be finished.
        let Ok(seg32) = u32::try_from(seg) else {
            return Err(Error::Protocol(format!(
                "data for segment {seg} of file {file}, past 2^32 segments"
            )));
        };
        if tally.start(seg32).is_err() {
            return Err(Error::Protocol(format!(
                "data for segment {seg} of file {file} after it was finished"
            )));
        }
        let k = worker_for(&f, seg, workers.len());
        send_op(&workers[k], f, op, &self.tx)
    }
}
