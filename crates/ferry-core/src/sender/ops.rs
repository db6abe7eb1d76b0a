//! A segment's delta ops as messages: copies as `Copy`, literal bytes as
//! `Data` chunks and `Zero` runs, and what writing in place allows.

use std::ops::Range;

use ferry_delta::Op;
use ferry_link::{LinkError, Message, MsgTx};

use crate::error::Result;
use crate::scan;

/// The literal for `range` of a buffer that holds the source from `lo`.
pub(super) fn literal(lo: u64, range: Range<usize>) -> Op {
    Op::Literal {
        offset: lo + range.start as u64,
        len: range.len() as u64,
    }
}

/// Send a segment's delta ops; literals come from `buf`, which holds the
/// source from offset `lo`.
pub(super) fn send_ops(
    id: u32,
    inplace: bool,
    tx: &MsgTx,
    ops: Vec<Op>,
    buf: &[u8],
    lo: u64,
) -> Result<()> {
    emit_ops(id, inplace, ops, buf, lo, &mut |m| tx.send(m))?;
    Ok(())
}

/// The messages for a segment's delta ops, in order, to `emit`: copies as
/// `Copy` (in place, only those from the same offset: a moved block could
/// already be overwritten), everything else as literal bytes from `buf`
/// (which holds the source from offset `lo`), its zero grains as `Zero`
/// and the rest as `Data` of at most [`scan::CHUNK`] bytes. Stops at the
/// first error `emit` returns.
fn emit_ops(
    id: u32,
    inplace: bool,
    ops: Vec<Op>,
    buf: &[u8],
    lo: u64,
    emit: &mut dyn FnMut(Message) -> std::result::Result<(), LinkError>,
) -> std::result::Result<(), LinkError> {
    for op in ops {
        match op {
            Op::Copy {
                offset,
                basis_offset,
                len,
            } if !inplace || basis_offset == offset => {
                emit(Message::Copy {
                    file: id,
                    offset,
                    basis_offset,
                    len,
                })?;
            }
            op => {
                let (offset, len) = (op.offset(), op.len());
                let lit = &buf[(offset - lo) as usize..(offset - lo + len) as usize];
                let mut err = None;
                scan::grain_runs(lit, offset, |zero, i, j| {
                    if err.is_some() {
                        return;
                    }
                    let off = offset + i as u64;
                    let r = if zero {
                        emit(Message::Zero {
                            file: id,
                            offset: off,
                            len: (j - i) as u64,
                        })
                    } else {
                        lit[i..j]
                            .chunks(scan::CHUNK)
                            .enumerate()
                            .try_for_each(|(k, c)| {
                                emit(Message::Data {
                                    file: id,
                                    offset: off + (k * scan::CHUNK) as u64,
                                    data: c.to_vec(),
                                })
                            })
                    };
                    if let Err(e) = r {
                        err = Some(e);
                    }
                });
                if let Some(e) = err {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_link::layout::ZERO_GRAIN;

    const G: usize = ZERO_GRAIN as usize;

    fn emitted(inplace: bool, ops: Vec<Op>, buf: &[u8], lo: u64) -> Vec<Message> {
        let mut out = Vec::new();
        emit_ops(9, inplace, ops, buf, lo, &mut |m| {
            out.push(m);
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn copies_keep_their_offset_only_in_place() {
        let buf: Vec<u8> = (0..2 * G).map(|i| (i % 251) as u8 + 1).collect();
        let moved = Op::Copy {
            offset: 0,
            basis_offset: G as u64,
            len: G as u64,
        };
        // Not in place: the moved copy goes as it is.
        assert_eq!(
            emitted(false, vec![moved], &buf, 0),
            [Message::Copy {
                file: 9,
                offset: 0,
                basis_offset: G as u64,
                len: G as u64
            }]
        );
        // In place: its bytes are sent instead.
        assert_eq!(
            emitted(true, vec![moved], &buf, 0),
            [Message::Data {
                file: 9,
                offset: 0,
                data: buf[..G].to_vec()
            }]
        );
        // A copy from the same offset stays a copy in place.
        let same = Op::Copy {
            offset: G as u64,
            basis_offset: G as u64,
            len: G as u64,
        };
        assert_eq!(
            emitted(true, vec![same], &buf, 0),
            [Message::Copy {
                file: 9,
                offset: G as u64,
                basis_offset: G as u64,
                len: G as u64
            }]
        );
    }

    #[test]
    fn literal_zero_grains_go_as_zero_ops() {
        // Source from offset `lo`: one grain of data, two of zeros, one of
        // data.
        let lo = 16 * G as u64;
        let mut buf = vec![7u8; 4 * G];
        buf[G..3 * G].fill(0);
        let ops = vec![Op::Literal {
            offset: lo,
            len: 4 * G as u64,
        }];
        assert_eq!(
            emitted(false, ops, &buf, lo),
            [
                Message::Data {
                    file: 9,
                    offset: lo,
                    data: vec![7; G]
                },
                Message::Zero {
                    file: 9,
                    offset: lo + G as u64,
                    len: 2 * G as u64
                },
                Message::Data {
                    file: 9,
                    offset: lo + 3 * G as u64,
                    data: vec![7; G]
                },
            ]
        );
    }

    #[test]
    fn a_long_literal_is_sent_in_chunks() {
        let buf = vec![1u8; scan::CHUNK + 10];
        let ops = vec![Op::Literal {
            offset: 0,
            len: buf.len() as u64,
        }];
        let msgs = emitted(false, ops, &buf, 0);
        let sizes: Vec<(u64, usize)> = msgs
            .iter()
            .map(|m| match m {
                Message::Data { offset, data, .. } => (*offset, data.len()),
                m => panic!("unexpected {m:?}"),
            })
            .collect();
        assert_eq!(sizes, [(0, scan::CHUNK), (scan::CHUNK as u64, 10)]);
    }

    #[test]
    fn a_literal_is_taken_from_the_buffer_at_its_offset() {
        let buf: Vec<u8> = (0..3 * G).map(|i| (i / G) as u8 + 1).collect();
        let ops = vec![literal(1000, G..2 * G)];
        assert_eq!(
            emitted(false, ops, &buf, 1000),
            [Message::Data {
                file: 9,
                offset: 1000 + G as u64,
                data: vec![2; G]
            }]
        );
    }

    #[test]
    fn sending_stops_at_the_first_link_error() {
        let buf = vec![0u8; 4 * G];
        let ops = vec![
            Op::Literal {
                offset: 0,
                len: G as u64,
            },
            Op::Copy {
                offset: G as u64,
                basis_offset: G as u64,
                len: G as u64,
            },
        ];
        let mut calls = 0;
        let r = emit_ops(1, false, ops, &buf, 0, &mut |_| {
            calls += 1;
            Err(LinkError::Closed)
        });
        assert!(matches!(r, Err(LinkError::Closed)));
        assert_eq!(calls, 1);
    }
}
