//! Fields of on-disk structures, little- and big-endian. A read out of
//! range gives 0: every buffer is at least as long as the structure read
//! from it, so that never happens, but it must not panic either.

fn array<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(s) = off.checked_add(N).and_then(|end| b.get(off..end)) {
        a.copy_from_slice(s);
    }
    a
}

pub(crate) fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(array(b, off))
}

pub(crate) fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(array(b, off))
}

pub(crate) fn le64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(array(b, off))
}

pub(crate) fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes(array(b, off))
}

pub(crate) fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(array(b, off))
}

pub(crate) fn be64(b: &[u8], off: usize) -> u64 {
    u64::from_be_bytes(array(b, off))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_out_of_range() {
        let b = [1u8, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(le16(&b, 0), 0x0201);
        assert_eq!(be16(&b, 0), 0x0102);
        assert_eq!(le32(&b, 4), 0x0807_0605);
        assert_eq!(be64(&b, 0), 0x0102_0304_0506_0708);
        assert_eq!(le64(&b, 1), 0);
        assert_eq!(be32(&b, usize::MAX), 0);
    }
}
