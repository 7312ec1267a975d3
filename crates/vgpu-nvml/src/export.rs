//! `nvmlInternalGetExportTable`: the private table NVIDIA's own tools ask
//! NVML for right after initialisation. `nvidia-smi` refuses an NVML that
//! has none ("Mismatch in versions between nvidia-smi and NVML"); what it
//! calls of it answers from the vGPUs, the rest `NVML_ERROR_NOT_SUPPORTED`.

use std::ffi::{c_char, c_uint, c_void};

use crate::ffi::{entry, put_str};
use crate::nvml::nvmlReturn_t;
use crate::state;

/// `c4fe3e6c-c98f-6c4e-a327-ee696e12f7c4`, byte for byte as passed.
const TOOLS_ID: [u8; 16] = [
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4,
];

/// Entries of the table, its size word included.
const SLOTS: usize = 128;

struct Table([*const c_void; SLOTS]);

// SAFETY: function addresses and a size, never written.
unsafe impl Sync for Table {}

static TOOLS: Table = {
    let mut t = [unsupported_slot as *const c_void; SLOTS];
    t[0] = (SLOTS * std::mem::size_of::<*const c_void>()) as *const c_void;
    t[26] = log_line as *const c_void;
    t[81] = bus_id as *const c_void;
    Table(t)
};

/// The table `id` names, if this library has it.
pub fn table(id: &[u8; 16]) -> Option<*const c_void> {
    (*id == TOOLS_ID).then(|| TOOLS.0.as_ptr().cast())
}

/// What the slots nothing has been seen to call answer.
extern "C" fn unsupported_slot() -> nvmlReturn_t {
    entry(|| state::not_supported("an export table slot"))
}

/// Slot 26: `nvidia-smi` hands each line it prints to this, with a
/// format, the stream's name and the line (NVIDIA's NVML can keep them
/// in its debug log); there is none here.
extern "C" fn log_line(
    _format: *const c_char,
    _stream: *const c_char,
    _line: *const c_char,
) -> nvmlReturn_t {
    entry(|| state::gpus().map(drop))
}

/// Slot 81: the PCI bus id (`0000:00:02.0`) of device `index`, into
/// `len` bytes at `out`.
unsafe extern "C" fn bus_id(index: c_uint, out: *mut c_char, len: c_uint) -> nvmlReturn_t {
    entry(|| {
        let gpus = state::gpus()?;
        let g = gpus
            .get(index as usize)
            .ok_or(crate::Error::InvalidArgument)?;
        // SAFETY: `out` is writable for `len` bytes.
        unsafe { put_str(out, len, &g.pci.bus_id_legacy()) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_tools_table_is_found_and_it_is_full() {
        let t = table(&TOOLS_ID).unwrap().cast::<usize>();
        // SAFETY: the table has SLOTS words.
        let words = unsafe { std::slice::from_raw_parts(t, SLOTS) };
        assert_eq!(words[0], SLOTS * 8);
        assert!(words[1..].iter().all(|&w| w != 0));
        let mut other = TOOLS_ID;
        other[15] ^= 1;
        assert!(table(&other).is_none());
    }
}
