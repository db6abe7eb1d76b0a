//! The messages of the ferry protocol. See `docs/PROTOCOL.md` for the wire
//! form of each and for who may send what when.

/// The kind of a file list entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file (or a block device read as a file).
    File = 0,
    /// A directory.
    Dir = 1,
    /// A symbolic link; [`Entry::target`] holds its target.
    Symlink = 2,
    /// A further name of a file already listed; [`Entry::link_to`] is that
    /// file's id.
    HardLink = 3,
    /// A device node, FIFO or socket (`-D`), made at the destination as
    /// such: its type is [`Entry::mode`]'s, a device's number
    /// [`Entry::rdev`].
    Special = 4,
}

impl EntryKind {
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::File,
            1 => Self::Dir,
            2 => Self::Symlink,
            3 => Self::HardLink,
            4 => Self::Special,
            _ => return None,
        })
    }
}

/// One entry of the file list, sent by the sender as it walks the source.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Entry {
    /// Sender-assigned id, unique in the session, increasing.
    pub id: u32,
    /// Path relative to the destination root, `/`-separated, no leading `/`,
    /// no `.` or `..` components. The empty path is the root itself.
    pub path: Vec<u8>,
    pub kind: Option<EntryKind>,
    /// Full `st_mode` permission and type bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Logical size in bytes (files only).
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// Symlink target.
    pub target: Vec<u8>,
    /// For hard links: id of the first entry naming the same inode.
    pub link_to: u32,
    /// Extended attributes (only when requested).
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Whole-file content digest (only with `--checksum`).
    pub digest: Option<[u8; 32]>,
    /// The name of the owner `uid` on the sender's host, sent with the
    /// first entry of each `uid` only (empty otherwise, with
    /// `--numeric-ids`, or when the id has no name): the receiver maps
    /// names to its own ids, as rsync does.
    pub owner: Vec<u8>,
    /// The name of the group `gid`, sent as [`Entry::owner`] is.
    pub group: Vec<u8>,
    /// A device node's number (`st_rdev`); 0 for anything else.
    pub rdev: u64,
}

impl Entry {
    pub fn kind(&self) -> EntryKind {
        self.kind.unwrap_or(EntryKind::File)
    }
}

/// Features a peer supports, exchanged in [`Message::Hello`].
pub mod features {
    pub const DELTA: u64 = 1 << 0;
    pub const XATTRS: u64 = 1 << 1;
    pub const COMPRESS_ZSTD: u64 = 1 << 2;
    pub const COMPRESS_LZ4: u64 = 1 << 3;
    /// Sent by a sender (version 13) whose list is one walk: every
    /// directory's entries and subtree come together, so a directory is
    /// complete once an entry outside it comes, and the receiver may
    /// delete in it then (see docs/PROTOCOL.md, "Streamed deletion").
    pub const SUBTREES: u64 = 1 << 4;
    pub const ALL: u64 = DELTA | XATTRS;
}

/// What the receiver asks of the sender for one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WantMode {
    /// Send every data extent of the file.
    Whole = 0,
    /// A signature of the receiver's copy follows in [`Message::Signature`]
    /// messages, ending with one whose `last` is set; send a delta against it.
    Delta = 1,
    /// As `Delta`, but the receiver writes in place: only copies from the
    /// same offset are allowed (a moved block could already be overwritten).
    DeltaInPlace = 2,
    /// The receiver holds a partial copy from an interrupted run: which of
    /// its segments it has, with their digests, follows in
    /// [`Message::Have`] parts; the sender sends the others whole, and of
    /// those it has, only the ones whose digest differs from the source's.
    Resume = 3,
    /// (Version 11.) As `Resume`, but what the receiver lists is its old
    /// copy of a file that changed time, not size: the sender sends only
    /// the segments whose digest differs, and a file all of whose segments
    /// match costs no data at all. Final, as `Whole`: never asked again.
    Check = 4,
}

/// The receiver's tally, sent once at the end so that the side that runs the
/// command can report it whichever side received.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReceiverReport {
    /// Non-directory entries of the source list.
    pub files_total: u64,
    pub files_transferred: u64,
    pub files_delta: u64,
    pub files_deleted: u64,
    pub files_failed: u64,
    pub bytes_total: u64,
    pub bytes_transferred: u64,
    pub bytes_written: u64,
    pub bytes_matched: u64,
    /// Directory entries of the source list.
    pub dirs_total: u64,
    /// 1 when `--delete` was skipped because the sender could not read
    /// part of the source.
    pub delete_skipped: u64,
    /// Files sent as a delta whose result failed verification: the old
    /// file was kept, and the client sends them again whole.
    pub delta_mismatch: u64,
    /// Bytes of partial files from interrupted runs that were verified
    /// against the source and kept, not sent again.
    pub bytes_resumed: u64,
    /// Files that vanished or changed while the sender read them
    /// ([`Message::FileChanged`]): not sent, the receiver's copy kept.
    pub files_vanished: u64,
    /// Deletions `--max-delete` held back (version 8).
    pub deletes_held: u64,
    /// One line per failed entry, capped, for the side that prints.
    pub errors: Vec<String>,
}

/// A message of the ferry protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// First message in each direction.
    Hello { version: u32, features: u64 },
    /// S→R: one file list entry.
    Entry(Box<Entry>),
    /// S→R: the file list is complete.
    EndOfList,
    /// R→S: send the contents of file `file`.
    Want { file: u32, mode: WantMode },
    /// R→S (version 10): the receiver has decided on every entry whose id
    /// is below `below`: those it has not asked for by now it never will.
    /// The sender forgets them, and lists at most a window of entries
    /// ahead of the last `below` it got (see docs/PROTOCOL.md).
    Decided { below: u32 },
    /// R→S: part of the receiver's block signature of its copy of a file.
    Signature(SignaturePart),
    /// R→S: part of the list of segments a resumed file's partial copy
    /// holds (after a [`WantMode::Resume`] `Want`).
    Have(HavePart),
    /// S→R: literal bytes of `file` at `offset`.
    Data {
        file: u32,
        offset: u64,
        data: Vec<u8>,
    },
    /// S→R: `len` bytes of zeros (a hole or zero blocks) at `offset`.
    Zero { file: u32, offset: u64, len: u64 },
    /// S→R: `len` bytes at `offset` that the source's guest filesystem does
    /// not use (`--sparsify`): digested as zeros, holes in a new file, and
    /// left as they are where the file is written in place unless the
    /// receiver discards (`--discard`).
    Unused { file: u32, offset: u64, len: u64 },
    /// S→R: `len` bytes at `offset` are the receiver's old bytes at
    /// `basis_offset` (delta transfer only).
    Copy {
        file: u32,
        offset: u64,
        basis_offset: u64,
        len: u64,
    },
    /// S→R: every op of segment `segment` of `file` has been sent; `digest`
    /// is the segment digest of the source bytes (see [`crate::layout`]).
    SegmentDone {
        file: u32,
        segment: u32,
        digest: [u8; 32],
    },
    /// Either way: `file` cannot be transferred (source unreadable, changed
    /// while read, …). The receiver drops its partial copy.
    FileFailed { file: u32, error: String },
    /// S→R: `file` vanished, or changed, while the sender read it (an
    /// application still writing): not sent as read; the receiver drops
    /// its partial copy and keeps what it had. A warning, not a failure.
    FileChanged { file: u32, error: String },
    /// S→R (version 12): segments `first` to `first + count - 1` of `file`
    /// hold no data at all (holes of the source) and got no op: they end
    /// as a `Zero` covering each and its `SegmentDone` with the digest of
    /// zeros would leave them (see docs/PROTOCOL.md, "Holes"). A terabyte
    /// of holes costs one message, not one per segment.
    Holes { file: u32, first: u32, count: u32 },
    /// S→R: the sender has sent everything it was asked for.
    SenderDone,
    /// R→S: the receiver has finished; its tally.
    ReceiverDone(Box<ReceiverReport>),
    /// Either way: the session cannot go on; `class` says what kind of
    /// failure it is, so both sides exit with the same status.
    Fatal { class: FatalClass, error: String },
    /// A [`Message::Data`] compressed by the link (never seen by the
    /// engine: stream links make and unmake it).
    Compressed(CompressedData),
    /// R→S: one change the receiver made (or, with `--dry-run`, would
    /// make), for the side that lists them (`-v`, `-i`). Sent only when
    /// asked for.
    Change(Box<Change>),
}

/// A [`Message::Change`]: rsync's itemized form of one change.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Change {
    /// rsync's `%i`: 11 bytes `YXcstpoguax` (see docs/PROTOCOL.md), or
    /// `*deleting  `. Printable ASCII only.
    pub code: [u8; 11],
    /// The entry's path relative to the destination root.
    pub path: Vec<u8>,
    /// A symlink's target, or the path a hard link names (empty if none).
    pub to: Vec<u8>,
}

/// A [`Message::Signature`]: part of the receiver's block signature of its
/// copy of `file`. `weak[i]`/`strong[i]` describe block `first_block + i`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignaturePart {
    pub file: u32,
    pub block_size: u32,
    pub basis_size: u64,
    pub first_block: u64,
    pub weak: Vec<u64>,
    pub strong: Vec<[u8; 16]>,
    /// The signature's last part.
    pub last: bool,
}

/// A [`Message::Have`]: of `file`'s segments below `upto` (and at or
/// above the previous part's `upto`), the receiver's partial copy holds
/// those in `kept`, each with its segment digest; the others it lacks.
/// The part whose `upto` is the file's segment count is the last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HavePart {
    pub file: u32,
    pub upto: u64,
    /// `(segment, digest)`, segments strictly increasing, each below `upto`.
    pub kept: Vec<(u64, [u8; 32])>,
}

/// A [`Message::Compressed`]: the `raw_len` bytes of `file` at `offset`,
/// compressed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompressedData {
    pub file: u32,
    pub offset: u64,
    /// `ferry_compress::Packed::wire_id`.
    pub codec: u8,
    /// Which sender's zstd stream a stream block belongs to (0 for
    /// independent blocks).
    pub stream: u16,
    pub level: i32,
    pub raw_len: u32,
    pub data: Vec<u8>,
}

impl Message {
    /// Short name for diagnostics.
    pub fn name(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "Hello",
            Message::Entry(_) => "Entry",
            Message::EndOfList => "EndOfList",
            Message::Want { .. } => "Want",
            Message::Decided { .. } => "Decided",
            Message::Signature(_) => "Signature",
            Message::Have(_) => "Have",
            Message::Data { .. } => "Data",
            Message::Zero { .. } => "Zero",
            Message::Unused { .. } => "Unused",
            Message::Copy { .. } => "Copy",
            Message::SegmentDone { .. } => "SegmentDone",
            Message::Holes { .. } => "Holes",
            Message::FileFailed { .. } => "FileFailed",
            Message::FileChanged { .. } => "FileChanged",
            Message::SenderDone => "SenderDone",
            Message::ReceiverDone(_) => "ReceiverDone",
            Message::Fatal { .. } => "Fatal",
            Message::Compressed(_) => "Compressed",
            Message::Change(_) => "Change",
        }
    }
}

/// What kind of failure a [`Message::Fatal`] reports (wire: one byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FatalClass {
    /// Local I/O at the side that failed (missing source, unwritable
    /// destination, disk full).
    Io = 0,
    /// The side that failed received something that breaks the protocol.
    Protocol = 1,
    /// The side that failed lost its own link or timed out.
    Connection = 2,
    /// The request cannot be done as asked (bad options, a directory onto
    /// a file without `--force`).
    Usage = 3,
    /// The side that failed was stopped by a signal.
    Interrupted = 4,
}

impl FatalClass {
    /// The class of wire byte `b`; `None` for an unknown one.
    pub fn from_wire(b: u8) -> Option<FatalClass> {
        use FatalClass::*;
        [Io, Protocol, Connection, Usage, Interrupted]
            .get(b as usize)
            .copied()
    }
}
