//! ext2/3/4: the block group bitmaps.

use crate::error::FsError;
use crate::map::FsMap;
use crate::ReadAt;

/// Map the ext2/3/4 filesystem that starts at offset 0 of `r`.
pub fn free_ranges(r: &dyn ReadAt) -> Result<FsMap, FsError> {
    let _ = r;
    Err(FsError::NotThis("ext2/3/4"))
}
