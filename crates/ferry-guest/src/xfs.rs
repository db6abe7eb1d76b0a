//! XFS: the free-space B+trees of each allocation group.

use crate::error::FsError;
use crate::map::FsMap;
use crate::ReadAt;

/// Map the XFS filesystem that starts at offset 0 of `r`.
pub fn free_ranges(r: &dyn ReadAt) -> Result<FsMap, FsError> {
    let _ = r;
    Err(FsError::NotThis("xfs"))
}
