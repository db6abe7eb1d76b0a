//! Whole-file reading: a segment's data extents scanned (see
//! [`crate::scan`]) and sent as data and zero ops, with the segment digest
//! on the file's grid.

use std::cell::Cell;

use ferry_link::{LinkError, Message, MsgTx};

use crate::endpoint::Source;
use crate::error::Result;
use crate::scan::{self, Piece, ScanError};

use super::Job;

/// The op that carries one scanned piece of file `id`.
fn piece_message(id: u32, p: Piece<'_>) -> Message {
    match p {
        Piece::Data(offset, d) => Message::Data {
            file: id,
            offset,
            data: d.to_vec(),
        },
        Piece::Owned(offset, data) => Message::Data {
            file: id,
            offset,
            data,
        },
        Piece::Zero(offset, len) => Message::Zero {
            file: id,
            offset,
            len,
        },
        Piece::Unused(offset, len) => Message::Unused {
            file: id,
            offset,
            len,
        },
    }
}

/// Send one segment of a file as it is; with `hash`, digest it. Returns
/// the segment digest, or the read error. The segment's last op is left
/// in `held`, for the caller to send with what follows it (see
/// [`MsgTx::send_then`]).
pub(super) fn send_whole_segment(
    job: &Job,
    file: &dyn Source,
    hash: bool,
    tx: &MsgTx,
    buf: &mut Vec<u8>,
    held: &Cell<Option<Message>>,
) -> Result<std::io::Result<[u8; 32]>> {
    let res =
        scan::scan_segment::<LinkError>(
            file,
            job.file.size,
            job.seg,
            hash,
            buf,
            &mut |p| match held.replace(Some(piece_message(job.id, p))) {
                Some(before) => tx.send(before),
                None => Ok(()),
            },
        );
    match res {
        Ok(d) => Ok(Ok(d)),
        Err(ScanError::Emit(e)) => Err(e.into()),
        Err(ScanError::Io(e)) => Ok(Err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_become_data_and_zero_ops() {
        assert_eq!(
            piece_message(7, Piece::Data(4096, b"abc")),
            Message::Data {
                file: 7,
                offset: 4096,
                data: b"abc".to_vec()
            }
        );
        assert_eq!(
            piece_message(7, Piece::Owned(8, vec![1, 2])),
            Message::Data {
                file: 7,
                offset: 8,
                data: vec![1, 2]
            }
        );
        assert_eq!(
            piece_message(3, Piece::Zero(1 << 20, 65536)),
            Message::Zero {
                file: 3,
                offset: 1 << 20,
                len: 65536
            }
        );
    }
}
