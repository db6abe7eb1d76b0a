//! [`ReadCoverage`]: which bytes of a READ the content chunks of its
//! structured reply have answered so far.

use std::collections::BTreeMap;

use super::chunk::check_in_request;
use super::consts::CMD_READ;
use super::error::ProtoError;
use super::request::RequestInfo;

/// Tracks which bytes of a READ have been answered by content chunks, to
/// reject overlap and detect a reply that claims success without covering
/// the whole request.
#[derive(Clone, Debug)]
pub struct ReadCoverage {
    req_offset: u64,
    req_len: u64,
    /// start -> end of the ranges seen so far.
    ranges: BTreeMap<u64, u64>,
    covered: u64,
}

impl ReadCoverage {
    pub fn new(req: &RequestInfo) -> Self {
        ReadCoverage {
            req_offset: req.offset,
            req_len: req.len.into(),
            ranges: BTreeMap::new(),
            covered: 0,
        }
    }

    /// Records `[offset, offset+len)`; fails if outside the request or if it
    /// overlaps an earlier chunk.
    pub fn add(&mut self, offset: u64, len: u64) -> Result<(), ProtoError> {
        let req = RequestInfo {
            cmd: CMD_READ,
            offset: self.req_offset,
            len: self.req_len as u32,
        };
        check_in_request(offset, len, &req)?;
        if len == 0 {
            return Ok(());
        }
        let end = offset + len;
        if let Some((_, &pend)) = self.ranges.range(..=offset).next_back() {
            if pend > offset {
                return Err(ProtoError::Overlap { offset, len });
            }
        }
        if let Some((&nstart, _)) = self.ranges.range(offset..).next() {
            if nstart < end {
                return Err(ProtoError::Overlap { offset, len });
            }
        }
        self.ranges.insert(offset, end);
        self.covered += len;
        Ok(())
    }

    /// True once every byte of the request has been answered.
    pub fn complete(&self) -> bool {
        self.covered == self.req_len
    }
}
