//! CUDA fatbinaries: finding the PTX a module image carries.
//!
//! Layout (as `nvcc -fatbin` writes it, all little endian): a 16-byte
//! header (u32 magic `0xBA55ED50`, u16 version 1, u16 header size, u64
//! size of the entries that follow the header), then entries, each a
//! header followed by its payload:
//!
//! | offset | field |
//! |-------:|-------|
//! | 0  | u16 kind (1 PTX, 2 ELF cubin) |
//! | 2  | u16 version (`0x101`) |
//! | 4  | u32 entry header size |
//! | 8  | u64 payload size, padded (the next entry follows it) |
//! | 16 | u32 compressed payload size (0 when stored plain) |
//! | 28 | u32 SM version |
//! | 40 | u64 flags (`0x2000` LZ4 block, `0x8000` Zstd frame) |
//! | 56 | u64 uncompressed payload size |
//!
//! Several fatbinaries may follow each other in one image (what the
//! linker makes of relocatable device code); all are read.

use std::collections::BTreeSet;
use std::io::Read;

/// The magic number of fatbinary data.
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Entry kind: PTX text.
pub const KIND_PTX: u16 = 1;
/// Entry kind: an ELF cubin.
pub const KIND_ELF: u16 = 2;
/// Entry flag: the payload is one LZ4 block.
pub const FLAG_LZ4: u64 = 0x2000;
/// Entry flag: the payload is one Zstd frame.
pub const FLAG_ZSTD: u64 = 0x8000;

/// The largest PTX text one entry may decompress to. A declared size above
/// this is refused rather than allocated: no real kernel module comes near.
pub const MAX_PTX_BYTES: u64 = 256 << 20;

const ENTRY_MIN_HEADER: usize = 64;

/// Why a module image gives no PTX.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FatbinError {
    /// Neither a fatbinary nor PTX text.
    #[error("not a fatbinary or PTX text")]
    NotAModule,
    /// A header or entry does not fit in the image, or declares sizes that
    /// contradict each other.
    #[error("malformed fatbinary at offset {offset:#x}: {what}")]
    Malformed {
        /// Where in the image.
        offset: usize,
        /// What is wrong.
        what: &'static str,
    },
    /// A compressed entry that does not decompress to its declared size.
    #[error("entry at offset {offset:#x} does not decompress: {what}")]
    Decompress {
        /// The entry's offset in the image.
        offset: usize,
        /// The decompressor's complaint.
        what: String,
    },
    /// Only cubins (machine code), which a CPU cannot run.
    #[error("the fatbinary holds no PTX")]
    NoPtx,
    /// PTX that is not UTF-8 text.
    #[error("PTX entry at offset {0:#x} is not text")]
    NotText(usize),
}

fn u16_at(d: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        d.get(o..o.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn u32_at(d: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        d.get(o..o.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn u64_at(d: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        d.get(o..o.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// Whether `image` looks like PTX text: after blank lines and comments its
/// first word is a PTX directive.
pub fn is_ptx_text(image: &[u8]) -> bool {
    let head = &image[..image.len().min(4096)];
    let text = match std::str::from_utf8(head) {
        Ok(t) => t,
        // The cut may split a character: take what is valid.
        Err(e) => match std::str::from_utf8(&head[..e.valid_up_to()]) {
            Ok(t) => t,
            Err(_) => return false,
        },
    };
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix("//") {
            rest = r.find('\n').map_or("", |i| &r[i..]);
        } else if let Some(r) = rest.strip_prefix("/*") {
            match r.find("*/") {
                Some(i) => rest = &r[i + 2..],
                None => return false,
            }
        } else {
            break;
        }
    }
    [".version", ".target", ".address_size"]
        .iter()
        .any(|d| rest.starts_with(d))
}

/// The PTX texts in a module image: every PTX entry of a fatbinary (in
/// order), or the image itself when it is PTX text (a trailing NUL, as
/// `cuModuleLoadData` callers pass, is dropped).
pub fn extract_ptx(image: &[u8]) -> Result<Vec<String>, FatbinError> {
    if u32_at(image, 0) != Some(FATBIN_MAGIC) {
        if !is_ptx_text(image) {
            return Err(FatbinError::NotAModule);
        }
        let end = image.iter().position(|&b| b == 0).unwrap_or(image.len());
        let text = std::str::from_utf8(&image[..end]).map_err(|_| FatbinError::NotText(0))?;
        return Ok(vec![text.to_owned()]);
    }
    let mut out = Vec::new();
    read_fatbins(image, Some(&mut out), None)?;
    if out.is_empty() {
        return Err(FatbinError::NoPtx);
    }
    Ok(out)
}

/// The length of the fatbinaries at the start of `image` (one, or several
/// back to back as a linker places them), each checked to hold its
/// entries whole: what a driver reads when it is handed only a pointer.
pub fn fatbin_len(image: &[u8]) -> Result<usize, FatbinError> {
    if u32_at(image, 0) != Some(FATBIN_MAGIC) {
        return Err(FatbinError::NotAModule);
    }
    read_fatbins(image, None, None)
}

/// `e_machine` of a CUDA ELF image (a cubin).
const EM_CUDA: u16 = 190;
/// Section type without bytes in the file.
const SHT_NOBITS: u32 = 8;
/// Size of a 64-bit ELF header.
const ELF_HEADER: usize = 64;

/// Is `image` a CUDA cubin (a 64-bit little-endian ELF for `EM_CUDA`)?
/// Only the first 20 bytes are read.
pub fn is_cubin(image: &[u8]) -> bool {
    image.len() >= 20
        && image[..4] == *b"\x7fELF"
        && image[4] == 2
        && image[5] == 1
        && u16_at(image, 18) == Some(EM_CUDA)
}

/// How many bytes of the cubin at the start of `image` a driver reads: to
/// the end of its header tables and of every section and segment with
/// bytes in the file. When `image` is shorter than the tables its header
/// names, the answer is how much must be read to learn more (more than
/// `image.len()`), so a caller holding only a pointer reads in steps.
pub fn cubin_len(image: &[u8]) -> Result<usize, FatbinError> {
    let bad = |offset, what| FatbinError::Malformed { offset, what };
    if image.len() < ELF_HEADER {
        return Ok(ELF_HEADER);
    }
    if !is_cubin(image) {
        return Err(FatbinError::NotAModule);
    }
    let field = |o| u64_at(image, o).and_then(|v| usize::try_from(v).ok());
    let table = |off: usize, size: usize, count: usize| {
        size.checked_mul(count)
            .and_then(|n| n.checked_add(off))
            .ok_or(bad(off, "header table size"))
    };
    let phoff = field(0x20).ok_or(bad(0x20, "program header offset"))?;
    let shoff = field(0x28).ok_or(bad(0x28, "section header offset"))?;
    let (phsize, phnum) = (u16_at(image, 0x36), u16_at(image, 0x38));
    let (shsize, shnum) = (u16_at(image, 0x3a), u16_at(image, 0x3c));
    let (phsize, phnum, shsize, shnum) = (
        usize::from(phsize.unwrap_or(0)),
        usize::from(phnum.unwrap_or(0)),
        usize::from(shsize.unwrap_or(0)),
        usize::from(shnum.unwrap_or(0)),
    );
    if (phnum > 0 && phsize < 0x38) || (shnum > 0 && shsize < 0x40) {
        return Err(bad(0x36, "header entry size"));
    }
    let ph_end = if phnum > 0 {
        table(phoff, phsize, phnum)?
    } else {
        0
    };
    let sh_end = if shnum > 0 {
        table(shoff, shsize, shnum)?
    } else {
        0
    };
    let mut end = ELF_HEADER.max(ph_end).max(sh_end);
    if end > image.len() {
        return Ok(end);
    }
    let extent = |at: usize, off_field: usize, size_field: usize| {
        let off = field(at + off_field).ok_or(bad(at, "offset"))?;
        let size = field(at + size_field).ok_or(bad(at, "size"))?;
        off.checked_add(size).ok_or(bad(at, "extent"))
    };
    for i in 0..shnum {
        let at = shoff + i * shsize;
        if u32_at(image, at + 4) != Some(SHT_NOBITS) {
            end = end.max(extent(at, 0x18, 0x20)?);
        }
    }
    for i in 0..phnum {
        end = end.max(extent(phoff + i * phsize, 0x08, 0x20)?);
    }
    Ok(end)
}

/// The functions a cubin holds code for: the names of its `.text.NAME`
/// sections (its kernels, and device functions compiled apart from them).
pub fn cubin_function_names(cubin: &[u8]) -> Result<Vec<String>, FatbinError> {
    let bad = |offset, what| FatbinError::Malformed { offset, what };
    if !is_cubin(cubin) || cubin.len() < ELF_HEADER {
        return Err(FatbinError::NotAModule);
    }
    let shoff = u64_at(cubin, 0x28)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or(bad(0x28, "section header offset"))?;
    let shsize = usize::from(u16_at(cubin, 0x3a).unwrap_or(0));
    let shnum = usize::from(u16_at(cubin, 0x3c).unwrap_or(0));
    let strndx = usize::from(u16_at(cubin, 0x3e).unwrap_or(0));
    if shnum == 0 {
        return Ok(Vec::new());
    }
    if shsize < 0x40 || strndx >= shnum {
        return Err(bad(0x3a, "section headers"));
    }
    let header = |i: usize| {
        let at = i
            .checked_mul(shsize)
            .and_then(|o| o.checked_add(shoff))
            .filter(|&a| a.checked_add(0x40).is_some_and(|e| e <= cubin.len()))
            .ok_or(bad(shoff, "section header past the image"))?;
        Ok::<_, FatbinError>(at)
    };
    let strtab = header(strndx)?;
    let range = |at: usize| {
        let off = u64_at(cubin, at + 0x18).and_then(|v| usize::try_from(v).ok());
        let size = u64_at(cubin, at + 0x20).and_then(|v| usize::try_from(v).ok());
        off.zip(size)
            .and_then(|(o, n)| Some(o..o.checked_add(n)?))
            .filter(|r| r.end <= cubin.len())
            .ok_or(bad(at, "section past the image"))
    };
    let strings = &cubin[range(strtab)?];
    let mut names = Vec::new();
    for i in 0..shnum {
        let at = header(i)?;
        let name_at = u32_at(cubin, at).unwrap_or(0) as usize;
        let Some(tail) = strings.get(name_at..) else {
            return Err(bad(at, "section name past the string table"));
        };
        let name = tail.split(|&b| b == 0).next().unwrap_or(&[]);
        if let Some(f) = name.strip_prefix(b".text.") {
            let f = std::str::from_utf8(f).map_err(|_| FatbinError::NotText(at))?;
            names.push(f.to_owned());
        }
    }
    Ok(names)
}

/// The functions of a module image, a cubin or a fatbinary (from every
/// cubin stored in it uncompressed and whole), each named once.
pub fn function_names(image: &[u8]) -> Result<Vec<String>, FatbinError> {
    if is_cubin(image) {
        let mut names = cubin_function_names(image)?;
        names.sort();
        names.dedup();
        return Ok(names);
    }
    if u32_at(image, 0) != Some(FATBIN_MAGIC) {
        return Err(FatbinError::NotAModule);
    }
    let mut names = BTreeSet::new();
    read_fatbins(image, None, Some(&mut names))?;
    Ok(names.into_iter().collect())
}

/// Reads the fatbinaries back to back at the start of `image` (collecting
/// their PTX into `out` and their cubins' function names into `names`, if
/// given), returns where the last one ends.
fn read_fatbins(
    image: &[u8],
    mut out: Option<&mut Vec<String>>,
    mut names: Option<&mut BTreeSet<String>>,
) -> Result<usize, FatbinError> {
    let mut pos = 0usize;
    let mut end = 0usize;
    while pos < image.len() && u32_at(image, pos) == Some(FATBIN_MAGIC) {
        end = read_fatbin(image, pos, out.as_deref_mut(), names.as_deref_mut())?;
        pos = end;
        // Consecutive fatbinaries are 8-byte aligned; padding may follow.
        while pos < image.len() && !pos.is_multiple_of(8) && image[pos] == 0 {
            pos += 1;
        }
    }
    Ok(end)
}

/// Reads one fatbinary at `start` (collecting as [`read_fatbins`] does),
/// returns where it ends.
fn read_fatbin(
    image: &[u8],
    start: usize,
    mut out: Option<&mut Vec<String>>,
    mut names: Option<&mut BTreeSet<String>>,
) -> Result<usize, FatbinError> {
    let bad = |offset, what| FatbinError::Malformed { offset, what };
    let header_size = u16_at(image, start + 6).ok_or(bad(start, "truncated header"))? as usize;
    let size = u64_at(image, start + 8).ok_or(bad(start, "truncated header"))?;
    if header_size < 16 {
        return Err(bad(start, "header size below 16"));
    }
    let first = start
        .checked_add(header_size)
        .ok_or(bad(start, "header size"))?;
    let end = usize::try_from(size)
        .ok()
        .and_then(|s| first.checked_add(s))
        .filter(|&e| e <= image.len())
        .ok_or(bad(start, "entries extend past the image"))?;
    let mut at = first;
    while at < end {
        let trunc = bad(at, "truncated entry header");
        let kind = u16_at(image, at).ok_or(trunc.clone())?;
        let ehs = u32_at(image, at + 4).ok_or(trunc.clone())? as usize;
        if ehs < ENTRY_MIN_HEADER || at.checked_add(ehs).is_none_or(|h| h > end) {
            return Err(bad(at, "entry header size"));
        }
        let padded = u64_at(image, at + 8).ok_or(trunc.clone())?;
        let compressed = u32_at(image, at + 16).ok_or(trunc.clone())? as u64;
        let flags = u64_at(image, at + 40).ok_or(trunc.clone())?;
        let uncompressed = u64_at(image, at + 56).ok_or(trunc)?;
        let body = at + ehs;
        let body_end = usize::try_from(padded)
            .ok()
            .and_then(|p| body.checked_add(p))
            .filter(|&e| e <= end)
            .ok_or(bad(at, "payload extends past the fatbinary"))?;
        let payload = &image[body..body_end];
        if let (KIND_PTX, Some(out)) = (kind, out.as_deref_mut()) {
            let bytes = decode_payload(at, payload, flags, compressed, uncompressed)?;
            let text = bytes.split(|&b| b == 0).next().unwrap_or(&[]);
            let text = std::str::from_utf8(text).map_err(|_| FatbinError::NotText(at))?;
            out.push(text.to_owned());
        }
        // Names only of cubins stored plain: a caller loading a large
        // library should not pay for decompressing every one of them.
        if let (KIND_ELF, Some(names)) = (kind, names.as_deref_mut()) {
            if flags & (FLAG_LZ4 | FLAG_ZSTD) == 0 {
                names.extend(cubin_function_names(payload).unwrap_or_default());
            }
        }
        at = body_end;
    }
    Ok(end)
}

fn decode_payload(
    at: usize,
    payload: &[u8],
    flags: u64,
    compressed: u64,
    uncompressed: u64,
) -> Result<Vec<u8>, FatbinError> {
    let bad = |what| FatbinError::Malformed { offset: at, what };
    if flags & (FLAG_LZ4 | FLAG_ZSTD) == 0 {
        return Ok(payload.to_vec());
    }
    if uncompressed > MAX_PTX_BYTES {
        return Err(bad("uncompressed size above the limit"));
    }
    let csize = usize::try_from(compressed)
        .ok()
        .filter(|&c| c <= payload.len())
        .ok_or(bad("compressed size exceeds the payload"))?;
    let input = &payload[..csize];
    // Bounded by MAX_PTX_BYTES above.
    let want = uncompressed as usize;
    let derr = |what: String| FatbinError::Decompress { offset: at, what };
    if flags & FLAG_LZ4 != 0 {
        let mut buf = vec![0u8; want];
        let n =
            lz4_flex::block::decompress_into(input, &mut buf).map_err(|e| derr(e.to_string()))?;
        if n != want {
            return Err(derr(format!("{n} bytes, {want} declared")));
        }
        Ok(buf)
    } else {
        let mut src = input;
        let dec =
            ruzstd::decoding::StreamingDecoder::new(&mut src).map_err(|e| derr(e.to_string()))?;
        let mut buf = Vec::with_capacity(want.min(input.len().saturating_mul(64)));
        // One byte more than declared tells an oversized frame apart.
        dec.take(want as u64 + 1)
            .read_to_end(&mut buf)
            .map_err(|e| derr(e.to_string()))?;
        if buf.len() != want {
            return Err(derr(format!("{} bytes, {want} declared", buf.len())));
        }
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_accepted() {
        let t = b"// c\n/* x */ .version 8.0\n.target sm_90\n\0junk";
        let v = extract_ptx(t).unwrap();
        assert_eq!(
            v,
            vec!["// c\n/* x */ .version 8.0\n.target sm_90\n".to_string()]
        );
        assert_eq!(extract_ptx(b"hello"), Err(FatbinError::NotAModule));
        assert_eq!(extract_ptx(b""), Err(FatbinError::NotAModule));
    }

    /// A cubin of section headers only: the null section, the names, and
    /// one empty section per name given.
    fn cubin_with_sections(sections: &[&str]) -> Vec<u8> {
        let mut strings = b"\0.shstrtab\0".to_vec();
        let mut name_at = Vec::new();
        for s in sections {
            name_at.push(strings.len() as u32);
            strings.extend_from_slice(s.as_bytes());
            strings.push(0);
        }
        let shnum = sections.len() + 2;
        let strings_at = 64;
        let shoff = (strings_at + strings.len()).next_multiple_of(8);
        let mut img = vec![0u8; shoff + shnum * 64];
        img[..6].copy_from_slice(b"\x7fELF\x02\x01");
        img[18..20].copy_from_slice(&190u16.to_le_bytes());
        img[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
        img[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        img[0x3c..0x3e].copy_from_slice(&(shnum as u16).to_le_bytes());
        img[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
        img[strings_at..strings_at + strings.len()].copy_from_slice(&strings);
        let sh = |i: usize| shoff + i * 64;
        img[sh(1)..sh(1) + 4].copy_from_slice(&1u32.to_le_bytes());
        img[sh(1) + 0x18..sh(1) + 0x20].copy_from_slice(&(strings_at as u64).to_le_bytes());
        img[sh(1) + 0x20..sh(1) + 0x28].copy_from_slice(&(strings.len() as u64).to_le_bytes());
        for (i, at) in name_at.iter().enumerate() {
            img[sh(i + 2)..sh(i + 2) + 4].copy_from_slice(&at.to_le_bytes());
        }
        img
    }

    #[test]
    fn a_cubin_names_the_functions_it_has_code_for() {
        let cubin = cubin_with_sections(&[
            ".text._Z4scanPf",
            ".nv.info._Z4scanPf",
            ".text.lut",
            ".nv.constant0",
        ]);
        assert_eq!(
            cubin_function_names(&cubin).unwrap(),
            vec!["_Z4scanPf".to_string(), "lut".to_string()]
        );
        assert_eq!(
            function_names(&wrap(&entry(KIND_ELF, 0, &cubin, 0, 0))).unwrap(),
            vec!["_Z4scanPf".to_string(), "lut".to_string()]
        );
        let mut cut = cubin.clone();
        cut.truncate(cubin.len() - 10);
        assert!(cubin_function_names(&cut).is_err());
        assert!(function_names(b"not a module").is_err());
    }

    fn entry(kind: u16, flags: u64, payload: &[u8], compressed: u32, unc: u64) -> Vec<u8> {
        let mut e = vec![0u8; 64];
        e[0..2].copy_from_slice(&kind.to_le_bytes());
        e[2..4].copy_from_slice(&0x101u16.to_le_bytes());
        e[4..8].copy_from_slice(&64u32.to_le_bytes());
        e[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        e[16..20].copy_from_slice(&compressed.to_le_bytes());
        e[40..48].copy_from_slice(&flags.to_le_bytes());
        e[56..64].copy_from_slice(&unc.to_le_bytes());
        e.extend_from_slice(payload);
        e
    }

    fn wrap(entries: &[u8]) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        d.extend_from_slice(&1u16.to_le_bytes());
        d.extend_from_slice(&16u16.to_le_bytes());
        d.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        d.extend_from_slice(entries);
        d
    }

    #[test]
    fn synthetic_entries() {
        let ptx = b".version 8.0\n\0\0\0";
        let mut es = entry(KIND_ELF, 0, b"\x7fELF....", 0, 0);
        es.extend(entry(KIND_PTX, 0, ptx, 0, 0));
        let lz = lz4_flex::block::compress(b".version 9.0\n.target sm_90\n");
        es.extend(entry(KIND_PTX, FLAG_LZ4, &lz, lz.len() as u32, 27));
        let v = extract_ptx(&wrap(&es)).unwrap();
        assert_eq!(v, vec![".version 8.0\n", ".version 9.0\n.target sm_90\n"]);
        let only_elf = wrap(&entry(KIND_ELF, 0, b"\x7fELF", 0, 0));
        assert_eq!(extract_ptx(&only_elf), Err(FatbinError::NoPtx));
    }

    #[test]
    fn lies_are_refused() {
        let lz = lz4_flex::block::compress(b".version 9.0\n");
        // Declared larger than it decompresses to.
        let d = wrap(&entry(KIND_PTX, FLAG_LZ4, &lz, lz.len() as u32, 100));
        assert!(matches!(
            extract_ptx(&d),
            Err(FatbinError::Decompress { .. })
        ));
        // A huge declared size allocates nothing.
        let d = wrap(&entry(KIND_PTX, FLAG_ZSTD, &lz, lz.len() as u32, u64::MAX));
        assert!(matches!(
            extract_ptx(&d),
            Err(FatbinError::Malformed { .. })
        ));
        // Compressed size past the payload.
        let d = wrap(&entry(KIND_PTX, FLAG_LZ4, &lz, 1000, 13));
        assert!(matches!(
            extract_ptx(&d),
            Err(FatbinError::Malformed { .. })
        ));
        // Total size past the image, at every truncation.
        let full = wrap(&entry(KIND_PTX, 0, b".version 1\n", 0, 0));
        for n in 0..full.len() {
            assert!(extract_ptx(&full[..n]).is_err(), "{n}");
        }
        assert!(extract_ptx(&full).is_ok());
    }

    /// A cubin header: `shnum` sections of 64 bytes at `shoff`.
    fn cubin(shoff: u64, shnum: u16) -> Vec<u8> {
        let mut e = vec![0u8; 64];
        e[..4].copy_from_slice(b"\x7fELF");
        e[4] = 2;
        e[5] = 1;
        e[18..20].copy_from_slice(&EM_CUDA.to_le_bytes());
        e[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        e[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        e[0x3c..0x3e].copy_from_slice(&shnum.to_le_bytes());
        e
    }

    fn section(e: &mut Vec<u8>, ty: u32, off: u64, size: u64) {
        let mut s = vec![0u8; 64];
        s[4..8].copy_from_slice(&ty.to_le_bytes());
        s[0x18..0x20].copy_from_slice(&off.to_le_bytes());
        s[0x20..0x28].copy_from_slice(&size.to_le_bytes());
        e.extend_from_slice(&s);
    }

    #[test]
    fn cubin_len_reaches_the_last_section_and_asks_for_unread_tables() {
        let mut e = cubin(64, 3);
        section(&mut e, 0, 0, 0);
        section(&mut e, 1, 256, 100);
        // A NOBITS section (.bss) has no bytes in the file.
        section(&mut e, SHT_NOBITS, 356, 1 << 30);
        e.resize(356, 0xee);
        assert!(is_cubin(&e));
        assert_eq!(cubin_len(&e), Ok(356));
        // Read in steps from a pointer: the header, then the table.
        assert_eq!(cubin_len(&e[..10]), Ok(64));
        assert_eq!(cubin_len(&e[..64]), Ok(64 + 3 * 64));
        assert_eq!(cubin_len(&e[..256]), Ok(356));
        // A section past the end of memory, or a table size that wraps.
        let mut wrap = cubin(64, 1);
        section(&mut wrap, 1, u64::MAX, 2);
        assert!(cubin_len(&wrap).is_err());
        assert!(cubin_len(&cubin(u64::MAX - 8, 2)).is_err());
        let mut not_cuda = e.clone();
        not_cuda[18] = 62;
        assert_eq!(cubin_len(&not_cuda), Err(FatbinError::NotAModule));
    }

    #[test]
    fn fatbin_len_covers_back_to_back_fatbinaries_and_refuses_short_ones() {
        let one = wrap(&entry(KIND_ELF, 0, b"\x7fELF12345", 0, 0));
        assert_eq!(fatbin_len(&one), Ok(one.len()));
        // A cubin-only fatbinary is fine here: the host's driver runs it.
        let mut two = one.clone();
        // Padded to the next 8 bytes, as a linker places them.
        two.extend_from_slice(&[0; 7]);
        let second = wrap(&entry(KIND_PTX, 0, b".version 8.0\n", 0, 0));
        two.extend_from_slice(&second);
        assert_eq!(fatbin_len(&two), Ok(two.len()));
        // Trailing bytes that are not a fatbinary are not counted.
        let mut tail = one.clone();
        tail.extend_from_slice(b"garbage!");
        assert_eq!(fatbin_len(&tail), Ok(one.len()));
        for n in 0..one.len() {
            assert!(fatbin_len(&one[..n]).is_err(), "{n}");
        }
        assert_eq!(fatbin_len(b".version 8.0"), Err(FatbinError::NotAModule));
    }
}
