//! Linux swap: only its header page is kept.

use crate::error::FsError;
use crate::map::FsMap;
use crate::ReadAt;

/// Map the Linux swap area that starts at offset 0 of `r`.
pub fn free_ranges(r: &dyn ReadAt) -> Result<FsMap, FsError> {
    let _ = r;
    Err(FsError::NotThis("swap"))
}
